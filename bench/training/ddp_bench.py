"""PyTorch DDP reference for bench/training: the same MLP 784-1024-1024-10, batch 64 per rank,
fp32, SGD, synthetic data, gloo. Run under lspawn (env contract) with Debian's torch:

    lspawn --nprocs N /usr/bin/python3 bench/training/ddp_bench.py [--steps S]
    /usr/bin/python3 bench/training/ddp_bench.py --spawn N        # mp.spawn + DDP: spawn() -> first step

Prints one JSON line from rank 0 (same fields as train_bench).
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def step(ddp, opt, x, y):
    opt.zero_grad()
    F.nll_loss(F.log_softmax(ddp(x), 1), y).backward()
    opt.step()


def bench(steps, warmup):
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = nn.parallel.DistributedDataParallel(model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))

    phases = {}

    def run(n, sync):
        # Per phase, as train_bench: forward (with zero_grad), backward, optimizer step.
        fwd = bwd = ost = 0.0
        clock = time.perf_counter
        dist.barrier()
        t0 = clock()
        for _ in range(n):
            a = clock()
            opt.zero_grad()
            if sync:
                loss = F.nll_loss(F.log_softmax(ddp(x), 1), y)
                b = clock()
                loss.backward()
            else:
                with ddp.no_sync():
                    loss = F.nll_loss(F.log_softmax(ddp(x), 1), y)
                    b = clock()
                    loss.backward()
            c = clock()
            opt.step()
            d = clock()
            fwd, bwd, ost = fwd + b - a, bwd + c - b, ost + d - c
        phases.update(fwd=fwd / n, bwd=bwd / n, opt=ost / n)
        return (clock() - t0) / n

    run(warmup, True)
    t_ddp = run(steps, True)
    sync_phases = dict(phases)
    t_compute = run(steps // 2, False)
    bwd_nosync = phases["bwd"]
    flat = torch.zeros(sum(p.numel() for p in ddp.parameters()))
    dist.barrier()
    reps = max(10, steps // 4)
    t0 = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(flat)
    t_ar = (time.perf_counter() - t0) / reps
    hidden = 1.0 - (t_ddp - t_compute) / t_ar if world > 1 else 0.0
    if rank == 0:
        print(json.dumps({"impl": "pytorch-ddp", "torch": torch.__version__, "world": world,
                          "steps_per_s": round(1 / t_ddp, 2), "step_ms": round(t_ddp * 1e3, 2),
                          "compute_ms": round(t_compute * 1e3, 2), "allreduce_ms": round(t_ar * 1e3, 2),
                          "hidden": round(hidden, 2), "fwd_ms": round(sync_phases["fwd"] * 1e3, 2),
                          "bwd_ms": round(sync_phases["bwd"] * 1e3, 2), "bwd_nosync_ms": round(bwd_nosync * 1e3, 2),
                          "opt_ms": round(sync_phases["opt"] * 1e3, 2), "intra_op_threads": torch.get_num_threads()}),
              flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # Debian's torch 1.13 on Python 3.11: after the measurement a rank sometimes never finishes
    # exiting (seen here: rank 0 spinning after destroy_process_group while rank 1 had exited);
    # leave at once, the figures are printed.
    sys.stdout.flush()
    os._exit(0)


def spawned(index, world, port, started, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(index), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method="env://")
    ddp = nn.parallel.DistributedDataParallel(model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    step(ddp, opt, torch.randn(64, 784), torch.randint(0, 10, (64,)))
    if index == 0:
        queue.put(time.monotonic() - started)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--spawn", type=int, default=0)
    p.add_argument("--port", type=int, default=29533)
    a = p.parse_args()
    if a.spawn:
        started = time.monotonic()
        ctx = mp.get_context("spawn")
        q = ctx.SimpleQueue()
        mp.start_processes(spawned, args=(a.spawn, a.port, started, q), nprocs=a.spawn, start_method="spawn")
        print(json.dumps({"impl": "torch.multiprocessing.spawn+DDP", "nprocs": a.spawn,
                          "fit_to_first_step_s": round(q.get(), 3), "total_s": round(time.monotonic() - started, 3)}))
        return
    bench(a.steps, a.warmup)


if __name__ == "__main__":
    main()
