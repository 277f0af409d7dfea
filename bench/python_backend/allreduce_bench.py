"""Collectives through torch.distributed: the `lspawn` backend against gloo (and Open MPI, and the engine from C).

For each backend (lspawn, gloo) and each N (2, 4) the parent starts N ranks of this Python on one host, joined
through a TCPStore on port 0 (tests/python_backend/harness.py's approach), and each rank times all_reduce (sum,
float32), all_gather (all_gather_into_tensor; _all_gather_base on torch 1.x) and broadcast (root 0) at 4 B, 1 KiB,
16 KiB, 256 KiB, 4 MiB, 16 MiB and 64 MiB: 3 warm-ups, an iteration count sized from the fastest of 5 more to
last about --budget-ms (max over ranks, 5..2000), a barrier, then the median of rank 0's per-iteration times.

The parent prints one markdown table: op | N | size | gloo | lspawn | Open MPI (all_reduce; from --mpi-json,
written by mpi_allreduce.c) | lspawn/gloo, and a second for all_reduce <= 16 KiB: lspawn through Python against
the engine alone from C (--engine-json, written by engine_bench.c). bench/python_backend/run.sh runs it all.

    python allreduce_bench.py [--nprocs 2,4] [--backends lspawn,gloo] [--ops all_reduce,all_gather,broadcast]
                              [--budget-ms 300] [--mpi-json F] [--engine-json F] [--json OUT] [--hosts K]
Env: PYTHONPATH with the source tree's python/, LSPAWN_ENGINE, LSPAWN_BACKEND_SHIM_DIR (as for the tests).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python_backend"))
import harness  # noqa: E402  (the rank starter the backend's tests use)

SIZES = [4, 1 << 10, 16 << 10, 256 << 10, 4 << 20, 16 << 20, 64 << 20]
OPS = ["all_reduce", "all_gather", "broadcast"]


def human(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return "%d %s" % (b // k, unit)
    return "%d B" % b


# ------------------------------------------------------------------ worker

def worker(args):
    import statistics
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = os.environ["BENCH_BACKEND"]
    harness.init(None if backend == "lspawn" else "gloo")  # None: cpu:lspawn (2.x) or lspawn (1.13)
    import lspawn.distributed
    transport = lspawn.distributed.transport() if backend == "lspawn" else "gloo"
    gather = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    ops = args.ops.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    for op in ops:
        for nbytes in sizes:
            count = max(1, nbytes // 4)
            x = torch.full((count,), float(rank + 1), dtype=torch.float32)
            out = torch.empty(count * n, dtype=torch.float32) if op == "all_gather" else None
            if op == "all_reduce":
                run = lambda: dist.all_reduce(x)  # noqa: E731
            elif op == "all_gather":
                run = lambda: gather(out, x)  # noqa: E731
            else:
                run = lambda: dist.broadcast(x, src=0)  # noqa: E731
            for _ in range(3):
                run()
            dist.barrier()
            fastest = 1e9
            for _ in range(5):
                t = time.perf_counter()
                run()
                fastest = min(fastest, time.perf_counter() - t)
            iters = torch.tensor([min(2000.0, max(5.0, args.budget_ms / 1e3 / max(fastest, 1e-7)))],
                                 dtype=torch.float64)
            dist.all_reduce(iters, op=dist.ReduceOp.MAX)
            iters = int(iters.item())
            times = []
            dist.barrier()
            for _ in range(iters):
                t = time.perf_counter()
                run()
                times.append(time.perf_counter() - t)
            check = None
            # all_reduce and broadcast run in place (values grow): timed, not checked
            if op == "all_gather":
                check = bool(out[count * (n - 1)].item() == float(n))
            if rank == 0:
                print(json.dumps({"impl": backend, "transport": transport, "op": op, "nprocs": n, "bytes": count * 4,
                                  "iters": iters, "median_us": statistics.median(times) * 1e6,
                                  "check": check}), flush=True)
            del x, out
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------ parent

def run_ranks(backend, n, args, timeout):
    """N ranks of this script's worker (tests/python_backend/harness.py starts them); rank 0's JSON rows."""
    per_host = -(-n // args.hosts)  # --hosts K: ranks in K blocks, each a host to the lspawn backend
    results = harness.run_ranks(os.path.abspath(__file__), n, ["--ops", args.ops, "--sizes", args.sizes,
                                                                "--budget-ms", str(args.budget_ms)],
                                timeout=timeout, env={"BENCH_BACKEND": backend, "MKL_NUM_THREADS": "1"}, check=False,
                                rank_env=(lambda r: {"LSPAWN_BACKEND_HOST_KEY": "host%d" % (r // per_host)})
                                if args.hosts > 1 else None)
    failed = any(code != 0 for _, code, _ in results)
    rows = [json.loads(line) for line in results[0][2].splitlines() if line.startswith("{")]
    if failed:
        for rank, code, out in results:
            tail = "\n".join(out.strip().splitlines()[-15:])
            print("---- %s N=%d rank %d (exit %s) ----\n%s" % (backend, n, rank, code, tail), file=sys.stderr)
    return rows, failed

def load_jsonl(path):
    rows = []
    if path and os.path.exists(path):
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.startswith("{")]
    return rows


def fmt(v):
    if v is None:
        return "n/a"
    return "%.1f" % v if v < 1000 else "%.0f" % v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--nprocs", default="2,4")
    ap.add_argument("--backends", default="lspawn,gloo")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    ap.add_argument("--budget-ms", type=float, default=300)
    ap.add_argument("--timeout", type=float, default=240, help="per (backend, N) run, seconds")
    ap.add_argument("--mpi-json", help="JSON lines from mpi_allreduce.c")
    ap.add_argument("--engine-json", help="JSON lines from engine_bench.c")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--hosts", type=int, default=1,
                    help="simulate this many hosts (LSPAWN_BACKEND_HOST_KEY, ranks in contiguous blocks): lspawn "
                         "runs shm within each and gloo between the hosts' leaders (transport shm+gloo)")
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    rows, problems = [], []
    for n in [int(x) for x in args.nprocs.split(",")]:
        for backend in args.backends.split(","):
            t0 = time.monotonic()
            got, failed = run_ranks(backend, n, args, args.timeout)
            print("[bench] %s N=%d: %d rows in %.1f s%s" % (backend, n, len(got), time.monotonic() - t0,
                                                             " (FAILED)" if failed else ""), file=sys.stderr)
            if failed:
                problems.append("%s N=%d failed after %d rows" % (backend, n, len(got)))
            for r in got:
                want = "shm+gloo" if args.hosts > 1 and n > 1 else "shm"
                if backend == "lspawn" and r["transport"] != want:
                    problems.append("lspawn N=%d ran on %r, not %s" % (n, r["transport"], want))
                if r.get("check") is False:
                    problems.append("%s %s N=%d %d B: wrong result" % (backend, r["op"], n, r["bytes"]))
            rows += got
    mpi, engine = load_jsonl(args.mpi_json), load_jsonl(args.engine_json)
    rows += mpi + engine
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)

    def get(impl, op, n, b):
        for r in rows:
            if r["impl"] == impl and r["op"] == op and r["nprocs"] == n and r["bytes"] == b:
                return r["median_us"]
        return None

    sizes = [int(s) for s in args.sizes.split(",")]
    nprocs = [int(x) for x in args.nprocs.split(",")]
    print("\nMedian µs per op on rank 0 (float32; all_gather: size is each rank's part%s).\n"
          % (("; %d hosts simulated, ranks in contiguous blocks" % args.hosts) if args.hosts > 1 else ""))
    print("| op | N | size | gloo µs | lspawn µs | Open MPI µs | lspawn/gloo speedup |")
    print("|---|---|---|---:|---:|---:|---:|")
    for op in args.ops.split(","):
        for n in nprocs:
            for b in sizes:
                g, l_ = get("gloo", op, n, b), get("lspawn", op, n, b)
                m = get("openmpi", op, n, b) if op == "all_reduce" else None
                sp = "%.1fx" % (g / l_) if g and l_ else "n/a"
                print("| %s | %d | %s | %s | %s | %s | %s |" % (op, n, human(b), fmt(g), fmt(l_),
                                                                 fmt(m) if op == "all_reduce" else "", sp))
    if engine and "all_reduce" in args.ops.split(","):
        print("\nPython overhead: all_reduce through torch.distributed + lspawn vs the engine called from C "
              "(engine_bench.c).\n")
        print("| N | size | lspawn (Python) µs | engine from C µs | Python adds µs |")
        print("|---|---|---:|---:|---:|")
        for n in nprocs:
            for b in [s for s in sizes if s <= 16 << 10]:
                l_, e = get("lspawn", "all_reduce", n, b), get("engine", "all_reduce", n, b)
                add = "%.1f" % (l_ - e) if l_ is not None and e is not None else "n/a"
                print("| %d | %s | %s | %s | %s |" % (n, human(b), fmt(l_), fmt(e), add))
    if problems:
        print("\nProblems:\n" + "\n".join("- " + p for p in sorted(set(problems))))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main() or 0)
