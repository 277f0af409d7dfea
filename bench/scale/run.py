#!/usr/bin/env python3
"""Thousands of nodes on one machine: lspawn's node group against K simulated nodes, and torchrun
2.15's c10d rendezvous beside it (issue #35, docs/scale.md).

  bench/scale/run.py [options]

For each K, lspawn_scale_agent (scale_agent.cpp) starts one real lspawn as the coordinator (node 0
of a static job, workers /bin/sleep) and K-1 simulated member nodes that speak the node protocol
through cluster/'s own code; it prints formation, steady-state CPU and memory, the report on
request and the fan-out after a node is lost, as JSON lines. This script runs it for every K and
every lspawn given, side by side, fits the growth (the slope of log(value) against log(K)) and
draws the plots.

  --build DIR          the build holding bench/lspawn_scale_agent and launcher/lspawn (default build)
  --agent PATH --main PATH  those two programs, where they are elsewhere (ctest passes them)
  --lspawn PATH[=LABEL] another lspawn to measure beside the build's (e.g. an older commit's);
                       repeatable
  --ks 16,64,...       default 16,64,256,1024,4096 (--quick: 16,64,128)
  --steady S           seconds of each steady-state window (default 10; --quick 2)
  --repeat R           runs per (lspawn, K); the table shows medians (default 1)
  --real 16,64,...     also run K real lspawn processes (the coordinator first, then K-1 members
                       started at once, workers /bin/true): the coordinator's "K nodes joined
                       after" and the whole job's wall time, a check of the simulation
  --torchrun           also run bench/scale/torchrun_rdzv.py (torch 2.15's venv, .deps/torch2) at
                       the same K, with --torchrun-cap seconds per K (default 120)
  --json PATH          every measurement as JSON lines (default: a temporary file)
  --plots DIR          draw log-log plots there (needs matplotlib: bench/scale/setup-plot.sh)
  --quick              the CI check (ctest scale_nodes_quick, < 1 min): K = 16, 64, 128, then
                       exit 1 when growth is off. Ratios and slopes of one run, never an
                       absolute time:
                         no join was retried (128 nodes connect at once: more than the 64
                           unjoined connections the coordinator reads at a time),
                         formation's slope over 16..128 <= 1.5 (O(K) is 1, O(K^2) is 2; times
                           under 20 ms count as 20 ms),
                         CPU with changing records at 128 <= 16 x max(CPU at 16, 0.5 %) + 1 %
                           of a core (linear is 8x),
                         fan-out at 128 <= 3 x 8 x max(fan-out at 16, 5 ms),
                         report at 128 <= 10 x max(report at 16, 200 ms) (the starved report
                           of 52ce1fe took 19.6 s at 128 nodes).

The agent raises its open-file limit to what K needs (2 per node, the coordinator inherits it); a
hard limit below that is raised as root, and said.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# What each metric is, its unit, and whether the table shows it.
METRICS = [
    ("formation_s", "formation: last join → every node assigned", "s"),
    ("formation_total_s", "formation: first connect → every node assigned", "s"),
    ("join_retries", "joins retried (connections closed by the coordinator)", ""),
    ("steady_cpu_pct", "coordinator CPU, heartbeats only", "% of a core"),
    ("changing_cpu_pct", "coordinator CPU, records changing (training)", "% of a core"),
    ("steady_rss_mb", "coordinator RSS", "MB"),
    ("rss_per_node_kb", "coordinator RSS per node", "KB"),
    ("report_s", "report on request (SIGURG → last line)", "s"),
    ("report_bytes", "report size", "B"),
    ("fanout_s", "node lost → every other node told to stop", "s"),
    ("finish_s", "node lost → every node told the job ended", "s"),
    ("loss_detect_s", "node lost → the others see it (torchrun)", "s"),
    ("coordinator_formed_s", "the coordinator's rendezvous (its start → every node assigned)", "s"),
    ("start_all_s", "real lspawns: starting all K processes", "s"),
    ("run_s", "real lspawns: the whole job (start → every lspawn exited)", "s"),
    ("failed_nodes", "real lspawns: lspawns that exited non-zero", ""),
]


def run_agent(agent, lspawn, label, k, steady, out):
    cmd = [agent, "--lspawn", lspawn, "--nodes", str(k), "--steady", str(steady), "--changing"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    rows = []
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            r["tool"] = label
            rows.append(r)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        print(f"  {label} K={k}: the agent failed (exit {p.returncode})", flush=True)
    for r in rows:
        out.write(json.dumps(r) + "\n")
    out.flush()
    return rows


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ports import free_port  # noqa: E402  (bench/ports.py: reserved, held until exit)


def run_real(lspawn, k, out):
    """K real lspawns on loopback: static rendezvous, one /bin/true worker each."""
    import re
    import resource
    import time
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port = free_port()
    common = ["--nnodes", str(k), "--master-addr", "127.0.0.1", "--master-port", str(port), "--nprocs", "1",
              "--rdzv-timeout", "300"]
    t0 = time.monotonic()
    coord = subprocess.Popen([lspawn, "--node-rank", "0"] + common + ["/bin/true"],  # says "K nodes joined after"
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    members = [subprocess.Popen([lspawn, "--node-rank", str(i), "--quiet"] + common + ["/bin/true"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(1, k)]
    started = time.monotonic() - t0
    codes = [m.wait(timeout=600) for m in members]
    err = coord.communicate(timeout=600)[1]
    wall = time.monotonic() - t0
    bad = sum(1 for c in codes + [coord.returncode] if c != 0)
    formed = re.search(r"(\d+) nodes joined after ([0-9.]+) s", err)
    rows = [{"bench": "nodes", "tool": "lspawn, real members", "K": k, "metric": "start_all_s", "value": started},
            {"bench": "nodes", "tool": "lspawn, real members", "K": k, "metric": "run_s", "value": wall},
            {"bench": "nodes", "tool": "lspawn, real members", "K": k, "metric": "failed_nodes", "value": bad}]
    if formed:
        rows.append({"bench": "nodes", "tool": "lspawn, real members", "K": k, "metric": "coordinator_formed_s",
                     "value": float(formed.group(2))})
    if bad:
        print(f"  real K={k}: {bad} lspawn(s) exited non-zero; the coordinator said:\n{err}", flush=True)
    for r in rows:
        out.write(json.dumps(r) + "\n")
    out.flush()
    return rows


def run_torchrun(ks, cap, out_path):
    py = os.path.join(ROOT, ".deps", "torch2", "bin", "python")
    if not os.path.exists(py):
        print("  torchrun: no torch 2.x venv at .deps/torch2 (bash scripts/setup-torch2.sh); skipped")
        return []
    tmp = out_path + ".torchrun"
    cmd = [py, os.path.join(HERE, "torchrun_rdzv.py"), "--ks", ",".join(map(str, ks)), "--cap", str(cap), "--json", tmp]
    print("  " + " ".join(cmd), flush=True)
    subprocess.run(cmd, timeout=cap * len(ks) * 3 + 300)
    rows = []
    if os.path.exists(tmp):
        with open(tmp) as f:
            for line in f:
                r = json.loads(line)
                r["tool"] = "torchrun 2.15"
                rows.append(r)
    return rows


def medians(rows):
    by = {}
    for r in rows:
        if "K" not in r or not isinstance(r.get("value"), (int, float)):
            continue
        by.setdefault((r["tool"], r["metric"], r["K"]), []).append(float(r["value"]))
    return {key: statistics.median(v) for key, v in by.items()}


def slope(points):
    """Least-squares slope of log(value) on log(K); None with fewer than 2 positive points."""
    pts = [(math.log(k), math.log(v)) for k, v in points if v > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else None


def growth_text(s):
    if s is None:
        return "-"
    name = "O(1)" if s < 0.3 else "O(K)" if s < 1.3 else "O(K log K)..O(K^1.5)" if s < 1.6 else "O(K^2)"
    return f"K^{s:.2f} ({name})"


def table(med, tools, ks):
    lines = []
    for metric, what, unit in METRICS:
        have = [t for t in tools if any((t, metric, k) in med for k in ks)]
        if not have:
            continue
        lines.append(f"\n{what}" + (f" [{unit}]" if unit else "") + f"  ({metric})")
        lines.append("| K | " + " | ".join(have) + " |")
        lines.append("|---:|" + "---:|" * len(have))
        for k in ks:
            cells = []
            for t in have:
                v = med.get((t, metric, k))
                cells.append("-" if v is None else f"{v:.4g}")
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
        fits = [growth_text(slope([(k, med[(t, metric, k)]) for k in ks if (t, metric, k) in med])) for t in have]
        lines.append("| growth | " + " | ".join(fits) + " |")
    return "\n".join(lines)


def plots(med, tools, ks, where):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  plots: no matplotlib (bash bench/scale/setup-plot.sh, then run this script with its python)")
        return
    os.makedirs(where, exist_ok=True)
    for metric, what, unit in METRICS:
        series = [(t, [(k, med[(t, metric, k)]) for k in ks if (t, metric, k) in med and med[(t, metric, k)] > 0])
                  for t in tools]
        series = [(t, pts) for t, pts in series if len(pts) >= 2]
        if not series or metric in ("join_retries", "report_bytes"):
            continue
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for t, pts in series:
            s = slope(pts)
            ax.loglog([k for k, _ in pts], [v for _, v in pts], marker="o",
                      label=f"{t} (slope {s:.2f})" if s is not None else t)
        ax.set_xlabel("nodes K")
        ax.set_ylabel(unit or metric)
        ax.set_title(what, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(where, f"{metric}.svg")
        fig.savefig(path)
        plt.close(fig)
        print(f"  plot: {path}")


def quick_checks(med, tool):
    def v(metric, k):
        return med.get((tool, metric, k))
    problems = []
    for k in (16, 64, 128):
        if v("formation_s", k) is None:
            problems.append(f"K={k}: no formation figure (the agent failed)")
    if problems:
        return problems
    for k in (16, 64, 128):
        if v("join_retries", k):
            problems.append(f"K={k}: {v('join_retries', k):.0f} joins were retried (the coordinator closed connections)")
    s = slope([(k, max(v("formation_s", k), 0.02)) for k in (16, 64, 128)])
    if s is not None and s > 1.5:
        problems.append(f"formation grows as K^{s:.2f} over 16..128 (more than 1.5)")
    c16, c128 = v("changing_cpu_pct", 16), v("changing_cpu_pct", 128)
    if c16 is not None and c128 is not None and c128 > 16 * max(c16, 0.5) + 1.0:
        problems.append(f"steady CPU {c128:.2f} % at K=128 > 16 x max({c16:.2f} %, 0.5 %) at K=16 + 1 %")
    f16, f128 = v("fanout_s", 16), v("fanout_s", 128)
    if f16 is not None and f128 is not None and f128 > 3 * 8 * max(f16, 0.005):
        problems.append(f"fan-out {f128 * 1e3:.1f} ms at K=128 > 24 x {max(f16, 0.005) * 1e3:.1f} ms at K=16")
    r16, r128 = v("report_s", 16), v("report_s", 128)
    if r16 is not None and r128 is not None and r128 > 10 * max(r16, 0.2):
        problems.append(f"report {r128:.2f} s at K=128 > 10 x {max(r16, 0.2):.2f} s at K=16")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--lspawn", action="append", default=[])
    ap.add_argument("--agent")
    ap.add_argument("--main")
    ap.add_argument("--ks")
    ap.add_argument("--steady", type=float)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--real")
    ap.add_argument("--torchrun", action="store_true")
    ap.add_argument("--torchrun-cap", type=float, default=120)
    ap.add_argument("--json")
    ap.add_argument("--plots")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    ks = [int(k) for k in (a.ks or ("16,64,128" if a.quick else "16,64,256,1024,4096")).split(",")]
    steady = a.steady if a.steady is not None else (2 if a.quick else 10)
    agent = a.agent or os.path.join(a.build, "bench", "lspawn_scale_agent")
    lspawns = [(a.main or os.path.join(a.build, "launcher", "lspawn"), "lspawn")]
    for spec in a.lspawn:
        path, _, label = spec.partition("=")
        lspawns.append((path, label or path))
    for path in [agent] + [p for p, _ in lspawns]:
        if not os.access(path, os.X_OK):
            sys.exit(f"run.py: {path} is not an executable (build it: ninja -C {a.build} lspawn lspawn_scale_agent)")
    json_path = a.json or tempfile.mkstemp(prefix="lspawn-scale-", suffix=".jsonl")[1]
    print(f"nodes: K = {ks}, steady windows {steady} s, {a.repeat} run(s) each; JSON lines: {json_path}", flush=True)
    rows = []
    with open(json_path, "a") as out:
        for k in ks:
            for _ in range(a.repeat):
                for path, label in lspawns:  # side by side: each K's runs follow each other
                    print(f"  {label} K={k}", flush=True)
                    rows += run_agent(agent, path, label, k, steady, out)
        for k in [int(x) for x in a.real.split(",")] if a.real else []:
            print(f"  real lspawns K={k}", flush=True)
            rows += run_real(lspawns[0][0], k, out)
        if a.torchrun:
            tr = run_torchrun(ks, a.torchrun_cap, json_path)
            for r in tr:
                out.write(json.dumps(r) + "\n")
            rows += tr
    tools = [label for _, label in lspawns] + (["lspawn, real members"] if a.real else []) + \
        (["torchrun 2.15"] if a.torchrun else [])
    if a.real:
        ks = sorted(set(ks) | {int(x) for x in a.real.split(",")})
    med = medians(rows)
    print(table(med, tools, ks))
    if a.plots:
        plots(med, tools, ks, a.plots)
    if a.quick:
        problems = quick_checks(med, "lspawn")
        for p in problems:
            print(f"scale_nodes_quick: FAILED: {p}")
        if problems:
            return 1
        print("scale_nodes_quick: growth within bounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
