"""Best-of tables from bench/training/run.sh output (JSON lines on stdin or in the files named):

    bench/training/run.sh build 200 | tee out.jsonl; python3 bench/training/table.py out.jsonl

Steps/s: the best (highest) round per implementation, path and N, with the phase times of that
round; time to first step: the best (lowest) round per implementation and start method.
"""
import fileinput
import json

rows = [json.loads(l) for l in fileinput.input() if l.startswith("{")]
best = {}
for r in rows:
    if "steps_per_s" in r:
        key = (r["impl"] + ("/" + r["path"] if "path" in r else ""), r["world"])
        if key not in best or r["steps_per_s"] > best[key]["steps_per_s"]:
            best[key] = r
print("| impl | N | steps/s per rank (best) | rounds | step ms | fwd | bwd | bwd no_sync | opt | all-reduce alone | threads |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (impl, n), r in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    count = sum(1 for x in rows if "steps_per_s" in x and x["impl"] + ("/" + x["path"] if "path" in x else "") == impl and x["world"] == n)
    print(f"| {impl} | {n} | {r['steps_per_s']} | {count} | {r['step_ms']} | {r.get('fwd_ms', '')} | {r.get('bwd_ms', '')} "
          f"| {r.get('bwd_nosync_ms', '')} | {r.get('opt_ms', '')} | {r['allreduce_ms']} | {r.get('intra_op_threads', '')} |")
for n in sorted({k[1] for k in best}):
    py = [r for (i, w), r in best.items() if w == n and i.startswith("pytorch")]
    if py:
        for (i, w), r in sorted(best.items()):
            if w == n and i.startswith("lspawn"):
                print(f"N={n}: {i} / pytorch-ddp = {r['steps_per_s'] / py[0]['steps_per_s']:.2f}")
first = {}
for r in rows:
    if "fit_to_first_step_s" in r:
        key = r["impl"] + ("/" + r["start"] if "start" in r else "")
        first.setdefault(key, []).append(r["fit_to_first_step_s"])
if first:
    print("\n| fit() → end of first step, 2 workers | best s | all rounds |")
    print("|---|---|---|")
    for k, v in sorted(first.items(), key=lambda kv: min(kv[1])):
        print(f"| {k} | {min(v):.3f} | {', '.join(f'{x:.3f}' for x in v)} |")
