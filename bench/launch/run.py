#!/usr/bin/env python3
"""Launcher benchmark: lspawn against torchrun (--no-python) and mpirun, in one run, on the same
worker binaries.

  1. launcher overhead: N x /bin/true, launch to exit
  2. hello_allreduce job: launch -> rendezvous -> gloo process group -> all_reduce -> exit;
     lspawn twice: --start-method exec (one exec per worker, as torchrun and mpirun do) and
     --start-method forkserver (one exec; workers forked after LibTorch is loaded)
  3. fail-fast: 4 workers, rank 1 exits 3 after 1 s, time from its exit to the launcher's exit,
     and the exit code each launcher reports
  4. warm start (docs/warm-start.md): hello_allreduce, 4 ranks, launch to exit, with
     `lspawn --start-method warm` against a running `lspawn daemon` (its first run, which starts
     the daemon's forkserver, and the runs after it), beside the cold forkserver and torchrun

Prints markdown tables (median wall seconds, with min-max). Usage:
  python3 bench/launch/run.py --build build [--reps 10] [--slow-reps 3] [--nprocs 2,4,8]
                              [--only overhead,hello,fail,warm]
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH_PY = "/usr/bin/python3"  # Debian's interpreter, the one with torch 1.13.1


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ports import free_port  # noqa: E402  (bench/ports.py: reserved, held until exit)


def timed(cmd, env=None, timeout=120):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=timeout)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.decode(errors='replace')[-3000:]}")
    return dt


def stats(samples):
    return statistics.median(samples), min(samples), max(samples)


def fmt(s):
    if s is None:
        return "n/a"
    med, lo, hi = s
    return f"{med:.3f} ({lo:.3f}-{hi:.3f})"


class Tools:
    def __init__(self, build, need_fail=True):
        self.lspawn = os.path.join(build, "launcher", "lspawn")
        self.hello = os.path.join(build, "examples", "hello_allreduce")
        self.fail = os.path.join(build, "bench", "bench_fail_worker")
        self.torchrun = [TORCH_PY, os.path.join(ROOT, "scripts", "torchrun.py")]
        self.mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
        self.daemon_socket = None  # set while bench_warm's daemon runs
        for p in (self.lspawn, self.hello) + ((self.fail,) if need_fail else ()):
            if not os.access(p, os.X_OK):
                sys.exit(f"run.py: {p} is missing: build first (scripts/build.sh)")

    def cmd(self, tool, n, prog, port=None):
        port = port or free_port()
        if tool == "lspawn":
            return [self.lspawn, "--quiet", "--nprocs", str(n), prog]
        if tool == "lspawn-fs":
            return [self.lspawn, "--quiet", "--start-method", "forkserver", "--nprocs", str(n), prog]
        if tool == "lspawn-warm":
            return [self.lspawn, "--quiet", "--start-method", "warm", "--daemon-socket",
                    self.daemon_socket, "--nprocs", str(n), prog]
        if tool == "torchrun":
            return self.torchrun + ["--nproc_per_node", str(n), "--master_port", str(port),
                                    "--no_python", prog]
        if tool == "mpirun":
            return self.mpirun + ["-np", str(n), "-x", "MASTER_ADDR=127.0.0.1",
                                  "-x", f"MASTER_PORT={port}", prog]
        raise ValueError(tool)


def bench_overhead(t, ns, reps, slow_reps):
    rows = []
    for n in ns:
        row = {"n": n}
        for tool, r in (("lspawn", reps), ("mpirun", reps), ("torchrun", slow_reps)):
            row[tool] = stats([timed(t.cmd(tool, n, "/bin/true")) for _ in range(r)])
        rows.append(row)
    return rows


def bench_hello(t, ns, reps, slow_reps):
    rows = []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for n in ns:
        row = {"n": n}
        for tool, r in (("lspawn", reps), ("lspawn-fs", reps), ("mpirun", reps),
                        ("torchrun", slow_reps)):
            try:
                row[tool] = stats([timed(t.cmd(tool, n, t.hello), env=env) for _ in range(r)])
            except RuntimeError as e:
                print(f"# {tool} hello_allreduce N={n} failed: {e}", file=sys.stderr)
                row[tool] = None
        rows.append(row)
    return rows


def bench_fail(t, reps, slow_reps, n=4):
    rows = []
    for tool, r in (("lspawn", reps), ("mpirun", reps), ("torchrun", slow_reps)):
        lat, codes = [], set()
        for _ in range(r):
            with tempfile.TemporaryDirectory() as d:
                ts = os.path.join(d, "fail_ts")
                env = dict(os.environ, FAIL_TS_FILE=ts, FAIL_RANK="1", FAIL_AFTER_MS="1000")
                cmd = t.cmd(tool, n, t.fail)
                if tool == "mpirun":
                    cmd = cmd[:-1] + ["-x", "FAIL_TS_FILE", "-x", "FAIL_RANK", "-x", "FAIL_AFTER_MS", t.fail]
                p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   env=env, timeout=120)
                end = time.time_ns()
                with open(ts) as f:
                    lat.append((end - int(f.read())) / 1e9)
                codes.add(p.returncode)
        rows.append({"tool": tool, "lat": stats(lat), "codes": sorted(codes)})
    return rows


def bench_warm(t, reps, slow_reps, n=4):
    """hello_allreduce, n ranks: the daemon's first run, then warm runs; the cold forkserver and
    torchrun interleaved in the same invocation."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    row = {}
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o700)
        t.daemon_socket = os.path.join(d, "daemon.sock")
        log = open(os.path.join(d, "daemon.log"), "w")
        daemon = subprocess.Popen([t.lspawn, "daemon", "--socket", t.daemon_socket],
                                  stdout=log, stderr=log)
        try:
            for _ in range(200):
                if os.path.exists(t.daemon_socket):
                    break
                time.sleep(0.01)
            row["first"] = timed(t.cmd("lspawn-warm", n, t.hello), env=env)
            warm, cold = [], []
            for _ in range(reps):  # interleaved: the same machine state for both
                warm.append(timed(t.cmd("lspawn-warm", n, t.hello), env=env))
                cold.append(timed(t.cmd("lspawn-fs", n, t.hello), env=env))
            row["warm"], row["cold"] = stats(warm), stats(cold)
            try:
                row["torchrun"] = stats([timed(t.cmd("torchrun", n, t.hello), env=env)
                                         for _ in range(slow_reps)])
            except RuntimeError as e:
                print(f"# torchrun hello_allreduce N={n} failed: {e}", file=sys.stderr)
                row["torchrun"] = None
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
            log.close()
            t.daemon_socket = None
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--slow-reps", type=int, default=3, help="repetitions for torchrun (seconds each)")
    ap.add_argument("--nprocs", default="2,4,8")
    ap.add_argument("--only", default="overhead,hello,fail,warm",
                    help="comma-separated sections to run (overhead, hello, fail, warm)")
    a = ap.parse_args()
    ns = [int(x) for x in a.nprocs.split(",")]
    only = set(a.only.split(","))
    t = Tools(os.path.abspath(a.build), need_fail="fail" in only)
    print(f"# lspawn launcher benchmark — {os.uname().nodename}, {os.cpu_count()} cores, "
          f"median (min-max) wall seconds; lspawn/mpirun {a.reps} runs, torchrun {a.slow_reps} runs\n")

    if "overhead" in only:
        print("## Launcher overhead: N x /bin/true\n")
        print("| N | lspawn | mpirun | torchrun --no-python | mpirun / lspawn | torchrun / lspawn |")
        print("|---|---|---|---|---|---|")
        for r in bench_overhead(t, ns, a.reps, a.slow_reps):
            l = r["lspawn"][0]
            print(f"| {r['n']} | {fmt(r['lspawn'])} | {fmt(r['mpirun'])} | {fmt(r['torchrun'])} | "
                  f"{r['mpirun'][0] / l:.1f}x | {r['torchrun'][0] / l:.1f}x |")
        sys.stdout.flush()

    def ratio(r, tool):
        return f"{r['torchrun'][0] / r[tool][0]:.1f}x" if r["torchrun"] and r[tool] else "n/a"

    if "hello" in only:
        print("\n## hello_allreduce (rendezvous + gloo process group + all_reduce + barrier), same binary\n")
        print("| N | lspawn (exec) | lspawn --start-method forkserver | mpirun | torchrun --no-python "
              "| torchrun / lspawn (exec) | torchrun / lspawn (forkserver) |")
        print("|---|---|---|---|---|---|---|")
        for r in bench_hello(t, ns, a.reps, a.slow_reps):
            print(f"| {r['n']} | {fmt(r['lspawn'])} | {fmt(r['lspawn-fs'])} | {fmt(r['mpirun'])} | "
                  f"{fmt(r['torchrun'])} | {ratio(r, 'lspawn')} | {ratio(r, 'lspawn-fs')} |")
        sys.stdout.flush()

    if "fail" in only:
        print("\n## Fail-fast: 4 workers, rank 1 exits 3 after 1 s, others stop on SIGTERM\n")
        print("| launcher | failure -> launcher exit (s) | launcher exit code |")
        print("|---|---|---|")
        for r in bench_fail(t, a.reps, a.slow_reps):
            print(f"| {r['tool']} | {fmt(r['lat'])} | {', '.join(map(str, r['codes']))} |")
        sys.stdout.flush()

    if "warm" in only:
        print("\n## Warm start: hello_allreduce, 4 ranks, launch to exit\n")
        r = bench_warm(t, a.reps, a.slow_reps)
        print("| lspawn --start-method warm (daemon running) | lspawn --start-method warm, "
              "the daemon's first run | lspawn --start-method forkserver (cold) | "
              "torchrun --no-python | cold / warm | torchrun / warm |")
        print("|---|---|---|---|---|---|")
        tr = f"{r['torchrun'][0] / r['warm'][0]:.1f}x" if r["torchrun"] else "n/a"
        print(f"| {fmt(r['warm'])} | {r['first']:.3f} | {fmt(r['cold'])} | {fmt(r['torchrun'])} | "
              f"{r['cold'][0] / r['warm'][0]:.1f}x | {tr} |")


if __name__ == "__main__":
    main()
