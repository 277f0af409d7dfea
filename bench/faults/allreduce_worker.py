"""allreduce_worker.py [--iters K]: torchrun's counterpart of examples/hello_allreduce for
bench/faults/slow_links.sh. Joins the job from torchrun's environment (env://, gloo, torch's
defaults), all_reduces rank+1 K times, checks the sum N(N+1)/2 and prints it as hello_allreduce
does ("rank R/N: allreduce sum = S"), then a broadcast and a barrier."""
import argparse
import sys

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    t = None
    for _ in range(args.iters):
        t = torch.full((4,), float(r + 1))
        dist.all_reduce(t)
    want = n * (n + 1) / 2
    if not bool((t == want).all()):
        print(f"rank {r}/{n}: allreduce sum is wrong: got {t[0].item():g}, want {want:g}", file=sys.stderr)
        return 2
    print(f"rank {r}/{n}: allreduce sum = {t[0].item():g}", flush=True)
    b = torch.full((2,), 7.0 if r == 0 else 0.0)
    dist.broadcast(b, 0)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if bool((b == 7.0).all()) else 2


if __name__ == "__main__":
    sys.exit(main())
