"""CUDA tensors through torch.distributed: the `lspawn` backend (CUDA IPC; and staged through host memory,
LSPAWN_SHM_CUDA_IPC=0) against NCCL and gloo, in one run. Needs a GPU (scripts/gpu-python-check.sh runs it).

For each backend the parent starts N ranks (default 2) of this Python on one host, rank r on GPU r % count (all
on one GPU when there is one), joined through a TCPStore on port 0 (tests/python_backend/harness.py); each rank
times all_reduce (sum, float32), all_gather (all_gather_into_tensor) and broadcast (root 0) from 4 KiB to 64 MiB:
3 warm-ups, then an iteration count sized from the fastest of 5 more to last about --budget-ms, each iteration
ending in torch.cuda.synchronize(); the median of rank 0's. Prints one markdown table: op | size | nccl | gloo |
lspawn IPC | lspawn staged | the speedups. NCCL only with a GPU per rank (it refuses two ranks on one GPU:
"Duplicate GPU detected"); gloo's CUDA path stages through the host, as lspawn's staged one does.

    python cuda_bench.py [--nprocs 2] [--budget-ms 200] [--sizes 4096,...] [--json OUT]
Env: PYTHONPATH with the source tree's python/, LSPAWN_ENGINE, LSPAWN_BACKEND_SHIM_DIR (as for the tests).
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python_backend"))
import harness  # noqa: E402

SIZES = [4 << 10, 256 << 10, 2 << 20, 4 << 20, 16 << 20, 64 << 20]
BACKENDS = {"nccl": ("nccl", {}), "gloo": ("gloo", {}), "lspawn-ipc": ("lspawn", {}),
            "lspawn-staged": ("lspawn", {"LSPAWN_SHM_CUDA_IPC": "0"})}


def human(b):
    return "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)


def worker(args):
    import torch
    import torch.distributed as dist
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    name = os.environ["BENCH_BACKEND"]
    harness.init(BACKENDS[name][0])
    import lspawn.distributed as ld
    for op in ("all_reduce", "all_gather", "broadcast"):
        for nbytes in [int(s) for s in args.sizes.split(",")]:
            x = torch.full((nbytes // 4,), float(rank + 1), device=dev)
            out = torch.empty(nbytes // 4 * n, device=dev)
            parts = list(out.chunk(n))
            run = {"all_reduce": lambda: dist.all_reduce(x), "all_gather": lambda: dist.all_gather_into_tensor(out, x),
                   "broadcast": lambda: dist.broadcast(x, src=0)}[op]
            if op == "all_gather" and name == "gloo":  # gloo's CUDA all_gather_into_tensor is not in every 2.x
                run = lambda: dist.all_gather(parts, x)  # noqa: E731

            def timed():
                t = time.perf_counter()
                run()
                torch.cuda.synchronize()
                return time.perf_counter() - t
            for _ in range(3):
                timed()
            fastest = min(timed() for _ in range(5))
            iters = torch.tensor([min(1000.0, max(5.0, args.budget_ms / 1e3 / max(fastest, 1e-7)))], device=dev)
            dist.all_reduce(iters, op=dist.ReduceOp.MAX)
            dist.barrier()
            times = [timed() for _ in range(int(iters.item()))]
            if rank == 0:
                print(json.dumps({"impl": name, "op": op, "bytes": nbytes, "median_us": statistics.median(times) * 1e6,
                                  "cuda_ipc": ld.cuda_ipc() if name.startswith("lspawn") else None}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    ap.add_argument("--budget-ms", type=float, default=200)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    import torch
    if not torch.cuda.is_available():
        print("cuda_bench: no CUDA device", file=sys.stderr)
        return 2
    rows, problems = [], []
    for name, (_, env) in BACKENDS.items():
        if name == "nccl" and torch.cuda.device_count() < args.nprocs:  # "Duplicate GPU detected"
            print("[bench] nccl: skipped, %d GPU(s) for %d ranks (NCCL refuses two ranks on one GPU)"
                  % (torch.cuda.device_count(), args.nprocs), file=sys.stderr)
            continue
        t0 = time.monotonic()
        results = harness.run_ranks(os.path.abspath(__file__), args.nprocs,
                                    ["--sizes", args.sizes, "--budget-ms", str(args.budget_ms)],
                                    env=dict(env, BENCH_BACKEND=name), timeout=600, check=False)
        got = [json.loads(line) for line in results[0][2].splitlines() if line.startswith("{")]
        failed = any(code != 0 for _, code, _ in results)
        print("[bench] %s: %d rows in %.1f s%s" % (name, len(got), time.monotonic() - t0, " (FAILED)" if failed else ""),
              file=sys.stderr)
        if failed:
            problems.append(name + " failed")
            for rank, code, out in results:
                print("---- %s rank %d (exit %s) ----\n%s" % (name, rank, code, "\n".join(out.splitlines()[-15:])),
                      file=sys.stderr)
        if name == "lspawn-ipc" and any(r["cuda_ipc"] != "on" for r in got if r["bytes"] >= 2 << 20):
            problems.append("lspawn-ipc did not run on CUDA IPC: %s" % sorted({r["cuda_ipc"] for r in got}))
        rows += got
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)

    def get(impl, op, b):
        return next((r["median_us"] for r in rows if (r["impl"], r["op"], r["bytes"]) == (impl, op, b)), None)

    fmt = lambda v: "n/a" if v is None else ("%.1f" % v if v < 1000 else "%.0f" % v)  # noqa: E731
    print("\nMedian µs per op on rank 0, N = %d, %s (float32; all_gather: size is each rank's part).\n"
          % (args.nprocs, torch.cuda.get_device_name(0)))
    print("| op | size | nccl | gloo | lspawn IPC | lspawn staged | gloo / lspawn IPC | nccl / lspawn IPC |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for op in ("all_reduce", "all_gather", "broadcast"):
        for b in [int(s) for s in args.sizes.split(",")]:
            v = [get(i, op, b) for i in ("nccl", "gloo", "lspawn-ipc", "lspawn-staged")]
            ratios = ["%.2fx" % (ref / v[2]) if ref and v[2] else "n/a" for ref in (v[1], v[0])]
            print("| %s | %s | %s | %s |" % (op, human(b), " | ".join(fmt(x) for x in v), " | ".join(ratios)))
    if problems:
        print("\nProblems:\n" + "\n".join("- " + p for p in problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main() or 0)
