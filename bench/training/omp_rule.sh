#!/usr/bin/env bash
# OMP_NUM_THREADS for CPU DDP: lspawn's rule (each worker's share of the CPUs lspawn may use;
# unset for one worker) against torchrun 2.15's (1 whenever a node has several workers; unset for
# one), side by side in one run: the same DDP program (train_bench: MLP 784-1024-1024-10, gloo),
# the same launcher, only the variable differing as each rule sets it; plus lspawn with
# --numa-binding exclusive (each rank on cores of its own, OMP_NUM_THREADS its CPU count). Rounds
# interleaved; the table gives the median steps/s (rank 0's) and the threads each rank ran with.
# Usage: bench/training/omp_rule.sh [BUILD_DIR] [STEPS]   ROUNDS (default 3), NPROCS (default "1 2")
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
steps=${2:-200}
rounds=${ROUNDS:-3}
lspawn=$build/launcher/lspawn
bench=$build/bench/training/train_bench
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), build $build, $steps steps, $rounds rounds"
for r in $(seq 1 "$rounds"); do
  for n in ${NPROCS:-1 2}; do
    # torchrun's rule: OMP_NUM_THREADS=1 with several workers, the variable untouched for one.
    torchrun_env=(env -u OMP_NUM_THREADS)
    ((n > 1)) && torchrun_env=(env OMP_NUM_THREADS=1)
    for rule in lspawn torchrun lspawn-exclusive; do
      case $rule in
        lspawn) cmd=(env -u OMP_NUM_THREADS "$lspawn" --quiet --nprocs "$n" "$bench" --steps "$steps") ;;
        torchrun) cmd=("${torchrun_env[@]}" "$lspawn" --quiet --nprocs "$n" "$bench" --steps "$steps") ;;
        lspawn-exclusive) cmd=(env -u OMP_NUM_THREADS "$lspawn" --quiet --nprocs "$n" --numa-binding exclusive "$bench" --steps "$steps") ;;
      esac
      line=$(timeout 300 "${cmd[@]}" 2>&1 | grep -o '{"impl": "lspawn-ddp".*}' | head -1)
      [ -n "$line" ] || { echo "# $rule N=$n round $r failed: ${cmd[*]}"; continue; }
      echo "$line" | sed "s/}\$/, \"rule\": \"$rule\", \"n\": $n}/" >> "$out"
    done
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["n"], r["rule"]) for r in rows}, key=lambda k: (k[0], ["lspawn", "torchrun", "lspawn-exclusive"].index(k[1])))
print("| N | rule | intra-op threads | steps/s (median) | runs |")
print("|---|---|---|---|---|")
base = {}
for n, rule in keys:
    rs = [r for r in rows if r["n"] == n and r["rule"] == rule]
    med = statistics.median(r["steps_per_s"] for r in rs)
    threads = sorted({r["intra_op_threads"] for r in rs})
    if rule == "torchrun":
        base[n] = med
    print(f"| {n} | {rule} | {','.join(map(str, threads))} | {med:.1f} | {len(rs)} |")
for n, rule in keys:
    if rule != "torchrun" and n in base:
        rs = [r["steps_per_s"] for r in rows if r["n"] == n and r["rule"] == rule]
        print(f"# N={n}: {rule} / torchrun's rule = {statistics.median(rs) / base[n]:.3f}")
PY
