"""The job of bench/multinode/elastic.py: one rank per node, torch.distributed over gloo.

Each round: init_process_group, an all_reduce of ones (checked against the world size), and
rank 0 prints "ELASTIC round=R world=W t=WALL" once that first collective of the round is done.
Then the round runs all_reduces every 50 ms until the world differs from the one the benchmark
is waiting for (ELASTIC_FINAL_WORLD): a round with that world does 5 more and exits 0; any other
round keeps going (up to 120 s), so that a node lost or admitted interrupts it in a collective.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    t = torch.ones(1)
    dist.all_reduce(t)
    if t.item() != world:
        print(f"rank {rank}: all_reduce gave {t.item()}, want {world}", file=sys.stderr, flush=True)
        return 3
    if rank == 0:
        print(f"ELASTIC round={restart} world={world} t={time.time():.6f}", flush=True)
    final = int(os.environ["ELASTIC_FINAL_WORLD"])
    steps = 5 if world == final else int(120 / 0.05)
    for _ in range(steps):
        time.sleep(0.05)
        dist.all_reduce(t)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
