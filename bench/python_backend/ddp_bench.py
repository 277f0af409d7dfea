"""DDP training steps/s: the `lspawn` backend against gloo, N ranks on one host.

Each rank trains DDP(MLP 784-1024-1024-10) on random data (batch 64 per rank, cross-entropy, SGD lr 0.01) with
torch.set_num_threads(1): 5 warm-up steps, a barrier, then --steps timed steps (default 30) and a barrier.
steps/s = steps / that time, per rank; the table gives rank 0's and the slowest rank's, and lspawn/gloo.
Ranks start as in allreduce_bench.py (TCPStore on port 0 in the parent).

    python ddp_bench.py [--nprocs 2,4] [--backends lspawn,gloo] [--steps 30] [--json OUT]
Env: PYTHONPATH with the source tree's python/, LSPAWN_ENGINE, LSPAWN_BACKEND_SHIM_DIR.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python_backend"))
import harness  # noqa: E402  (the rank starter the backend's tests use)


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = os.environ["BENCH_BACKEND"]
    transport = "gloo"
    harness.init(None if backend == "lspawn" else "gloo")  # None: cpu:lspawn (2.x) or lspawn (1.13)
    import lspawn.distributed
    if backend == "lspawn":
        transport = lspawn.distributed.transport()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1 + rank)
    data = [(torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(8)]

    def step(i):
        x, y = data[i % len(data)]
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for i in range(5):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    dist.barrier()
    secs = time.perf_counter() - t0
    print(json.dumps({"impl": backend, "transport": transport, "nprocs": n, "rank": rank, "steps": args.steps,
                      "secs": secs, "steps_per_s": args.steps / secs}), flush=True)
    dist.destroy_process_group()


def run_ranks(backend, n, args):
    """N ranks of this script's worker (tests/python_backend/harness.py starts them); every rank's JSON row."""
    results = harness.run_ranks(os.path.abspath(__file__), n, ["--steps", str(args.steps)], timeout=args.timeout,
                                env={"BENCH_BACKEND": backend, "MKL_NUM_THREADS": "1"}, check=False)
    rows, failed = [], False
    for rank, code, out in results:
        if code != 0:
            failed = True
            print("---- %s N=%d rank %d (exit %s) ----\n%s" % (backend, n, rank, code,
                                                            "\n".join(out.strip().splitlines()[-15:])),
                  file=sys.stderr)
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows, failed

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--nprocs", default="2,4")
    ap.add_argument("--backends", default="lspawn,gloo")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    rows, problems = [], []
    nprocs = [int(x) for x in args.nprocs.split(",")]
    for n in nprocs:
        for backend in args.backends.split(","):
            got, failed = run_ranks(backend, n, args)
            if failed:
                problems.append("%s N=%d failed" % (backend, n))
            for r in got:
                if backend == "lspawn" and r["transport"] != "shm":
                    problems.append("lspawn N=%d rank %d ran on %r, not shm" % (n, r["rank"], r["transport"]))
            rows += got
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)

    def pick(impl, n):
        rs = [r for r in rows if r["impl"] == impl and r["nprocs"] == n]
        if not rs:
            return None, None
        r0 = [r["steps_per_s"] for r in rs if r["rank"] == 0]
        return (r0[0] if r0 else None), min(r["steps_per_s"] for r in rs)

    print("\nDDP MLP 784-1024-1024-10, batch 64 per rank, SGD, %d steps after 5 warm-ups, 1 thread per rank.\n"
          % args.steps)
    print("| N | gloo steps/s (rank 0 / slowest) | lspawn steps/s (rank 0 / slowest) | lspawn/gloo |")
    print("|---|---:|---:|---:|")
    for n in nprocs:
        g0, gs = pick("gloo", n)
        l0, ls = pick("lspawn", n)
        f = lambda a, b: "%.1f / %.1f" % (a, b) if a is not None else "n/a"  # noqa: E731
        ratio = "%.2fx" % (ls / gs) if gs and ls else "n/a"
        print("| %d | %s | %s | %s |" % (n, f(g0, gs), f(l0, ls), ratio))
    if problems:
        print("\nProblems:\n" + "\n".join("- " + p for p in sorted(set(problems))))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main() or 0)
