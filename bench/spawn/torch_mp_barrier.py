#!/usr/bin/python3
"""torch.multiprocessing.spawn doing the job of spawn_barrier_bench: N ranks, each forming a
gloo process group (init_method env://) and running a barrier. Reports the time from the
spawn() call to the last rank past the barrier (time.monotonic_ns, the same CLOCK_MONOTONIC as
the C++ side), and until spawn() returned. `import torch` in the parent is not counted.

Usage: /usr/bin/python3 torch_mp_barrier.py [--nprocs 8] [--runs 10] [--method spawn|fork]
"""
import argparse
import os
import sys
import statistics
import time


def rank_main(index, nprocs, port, queue):
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=index, world_size=nprocs)
    dist.barrier()
    queue.put(time.monotonic_ns())
    dist.destroy_process_group()


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ports import free_port  # noqa: E402  (bench/ports.py: reserved, held until exit)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nprocs", type=int, default=8)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--method", default="spawn", choices=["spawn", "fork", "forkserver"])
    a = p.parse_args()
    import torch.multiprocessing as mp
    ctx = mp.get_context(a.method)
    to_barrier, total = [], []
    for r in range(a.runs):
        queue = ctx.SimpleQueue()
        t0 = time.monotonic_ns()
        mp.start_processes(rank_main, args=(a.nprocs, free_port(), queue), nprocs=a.nprocs,
                           start_method=a.method)
        t1 = time.monotonic_ns()
        last = max(queue.get() for _ in range(a.nprocs))
        to_barrier.append((last - t0) / 1e6)
        total.append((t1 - t0) / 1e6)
        print(f"run {r}: {to_barrier[-1]:.1f} ms to all ranks past the barrier, "
              f"{total[-1]:.1f} ms until spawn() returned", flush=True)
    print(f"torch.multiprocessing.spawn method={a.method} nprocs={a.nprocs} runs={a.runs} "
          f"median_ms_to_barrier={statistics.median(to_barrier):.1f} "
          f"median_ms_total={statistics.median(total):.1f}")


if __name__ == "__main__":
    main()
