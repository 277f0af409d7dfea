#!/usr/bin/python3
"""torch.distributed (gloo) reference for lspawn_bench_collectives: the same op x size sweep,
same timing rules (3 warm-ups, op count sized from the fastest of 5 more to last about the budget, slowest rank's
time). Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set (run.sh does,
or scripts/torchrun.py). Rank 0 prints one JSON object per line.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 /usr/bin/python3 torch_dist_bench.py
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--step", type=int, default=4)
    p.add_argument("--budget-ms", type=float, default=300.0)
    p.add_argument("--ops", default="all_reduce,broadcast,all_gather")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()

    def slowest(v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    for op in a.ops.split(","):
        nbytes = 4
        while nbytes <= a.max_bytes:
            count = max(1, nbytes // 4)
            x = torch.full((count,), float(rank + 1))
            outs = [torch.empty(count) for _ in range(n)]

            def once():
                if op == "all_reduce":
                    dist.all_reduce(x)
                elif op == "broadcast":
                    dist.broadcast(x, 0)
                else:
                    dist.all_gather(outs, x)

            for _ in range(3):
                once()
            dist.barrier()
            fastest = float("inf")
            for _ in range(5):
                t = time.perf_counter()
                once()
                fastest = min(fastest, time.perf_counter() - t)
            one = slowest(fastest)
            iters = torch.tensor([int(min(2000, max(5, a.budget_ms / 1e3 / max(one, 1e-7))))])
            dist.broadcast(iters, 0)
            iters = int(iters.item())
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                once()
            secs = slowest((time.perf_counter() - t0) / iters)
            algbw = count * 4 / secs / 1e9
            factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1 if op == "all_gather" else 1)
            if rank == 0:
                print(json.dumps({"impl": "torch-gloo", "op": op, "bytes": count * 4, "nprocs": n,
                                  "backend": "gloo", "time_us": secs * 1e6, "algbw_gbs": algbw,
                                  "busbw_gbs": algbw * factor}), flush=True)
            nbytes *= a.step
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
