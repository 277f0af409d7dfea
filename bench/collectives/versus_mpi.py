#!/usr/bin/env python3
"""lspawn's shm backend against Open MPI, one op, interleaved rounds, best of each.

On a VM the host moves the vCPUs around: the same binary can run at 0.15 us or 0.5 us per small
all_reduce from one minute to the next. A sweep of lspawn followed by a sweep of Open MPI can
then compare two different machines. This script alternates them, ROUNDS times per N, and keeps
the best busbw of each at every size.

  bench/collectives/versus_mpi.py [--build build] [--op all_reduce] [--nprocs 2 4] [--rounds 3]
                                  [--min-bytes 4] [--max-bytes 67108864] [--step 4] [--budget-ms 200]

Prints a table (time in us and busbw in GB/s of the best round, ratio lspawn/MPI by busbw) and
the worst ratio per N. Needs build/launcher/lspawn, build/bench/collectives/lspawn_bench_collectives
and build/bench/collectives/mpi_bench (built when mpicc exists).
"""
import argparse
import json
import os
import subprocess
import sys
import time

from compare import human  # bench/collectives/compare.py: 4096 -> "4 KiB"


def sizes(lo, hi, step):
    s = lo
    while s <= hi:
        yield s
        s *= step


def run_lspawn(a, n):
    cmd = [os.path.join(a.build, "launcher/lspawn"), "--nprocs", str(n), "--quiet",
           os.path.join(a.build, "bench/collectives/lspawn_bench_collectives"), "--ops", a.op,
           "--backends", "shm", "--min-bytes", str(a.min_bytes), "--max-bytes", str(a.max_bytes),
           "--step", str(a.step), "--budget-ms", str(a.budget_ms)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
    rows = {}
    for line in out.splitlines():
        f = line.replace("[rank 0]", "").split()
        if len(f) == 6 and f[0] == a.op and f[1] == "shm":
            rows[int(f[2])] = (float(f[3]), float(f[5]))
    return rows


def run_mpi(a, n):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n),
           os.path.join(a.build, "bench/collectives/mpi_bench"), str(a.max_bytes), str(a.step),
           str(a.budget_ms), str(a.min_bytes)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
    rows = {}
    for line in out.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            if d["op"] == a.op:
                rows[d["bytes"]] = (d["time_us"], d["busbw_gbs"])
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--op", default="all_reduce", choices=["all_reduce", "broadcast", "all_gather"])
    p.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-bytes", type=int, default=4)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--step", type=int, default=4)
    p.add_argument("--budget-ms", type=int, default=200)
    a = p.parse_args()
    load = open("/proc/loadavg").read().split()[:3]
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {os.cpu_count()} CPUs, load {' '.join(load)}, "
          f"{a.op}, float32, rounds {a.rounds} (lspawn and Open MPI alternated), best busbw of each")
    worst = {}
    print(f"{'N':>2} {'size':>8} {'lspawn-shm us':>14} {'busbw':>7} {'openmpi us':>11} {'busbw':>7} {'shm/mpi':>8}")
    for n in a.nprocs:
        best = {"lspawn": {}, "mpi": {}}
        for _ in range(a.rounds):
            for name, fn in (("lspawn", run_lspawn), ("mpi", run_mpi)):
                for b, (us, bw) in fn(a, n).items():
                    if b not in best[name] or bw > best[name][b][1]:
                        best[name][b] = (us, bw)
        for b in sizes(a.min_bytes, a.max_bytes, a.step):
            if b not in best["lspawn"] or b not in best["mpi"]:
                continue
            (lu, lb), (mu, mb) = best["lspawn"][b], best["mpi"][b]
            r = lb / mb if mb > 0 else float("inf")
            worst[n] = min(worst.get(n, r), r)
            print(f"{n:>2} {human(b):>8} {lu:>14.2f} {lb:>7.3f} {mu:>11.2f} {mb:>7.3f} {r:>8.2f}")
    for n, r in worst.items():
        print(f"# N = {n}: lowest shm/mpi ratio {r:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
