"""lspawn.spawn() against torch.multiprocessing.spawn(), side by side in one Python (docs/benchmarks.md §12).

Each call runs `fn` in 4 processes; fn joins a gloo process group and all-reduces one tensor:

  torch.multiprocessing.spawn(fn, nprocs=4)                      its default start method: spawn
  lspawn.spawn(fn, nprocs=4, preload=["torch"])                  workers forked from one interpreter
                                                                 that imported torch once, kept by
                                                                 this process's lspawn daemon: the
                                                                 first call (cold) apart, then warm
  lspawn.spawn(fn, nprocs=4, preload=["torch"], warm=False)      the same, a new interpreter per call
  lspawn.spawn(fn, nprocs=4, start_method="spawn")               exec per worker, as torch's
  lspawn.spawn(fn, nprocs=4, start_method="fork")                forked from this (torch-loaded) process
  torch.multiprocessing.start_processes(..., start_method="fork")  the same for torch

The whole call is timed (start to the last worker reaped), interleaved, ROUNDS rounds (default 5),
median and min printed. Run with the Python whose torch you want measured, the lspawn package
installed (pip install wheelhouse/lspawn-*.whl):

    python bench/python/spawn_vs_torch.py [ROUNDS]
"""
import contextlib
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

import lspawn

NPROCS = 4


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ports import reserve_port  # noqa: E402  (bench/ports.py: reserved, not probed)


def fn(i, port, world):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=i, world_size=world)
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world
    dist.destroy_process_group()


def timed(call):
    with contextlib.closing(reserve_port()) as held:  # held through the call: rank 0's store binds it
        t0 = time.perf_counter()
        call(held.getsockname()[1])
        return time.perf_counter() - t0


def import_torch(_port):
    """The floor of a cold preload call: one interpreter that imports torch (the forkserver does this)."""
    subprocess.run([sys.executable, "-c", "import torch"], check=True)


FIRST = "lspawn.spawn preload=['torch'], first call (cold)"
CASES = [
    ("torch.multiprocessing.spawn (spawn)", lambda port: tmp.spawn(fn, args=(port, NPROCS), nprocs=NPROCS)),
    ("lspawn.spawn preload=['torch'], later calls (warm)",
     lambda port: lspawn.spawn(fn, args=(port, NPROCS), nprocs=NPROCS, preload=["torch"])),
    ("lspawn.spawn preload=['torch'], warm=False",
     lambda port: lspawn.spawn(fn, args=(port, NPROCS), nprocs=NPROCS, preload=["torch"], warm=False)),
    ("lspawn.spawn (spawn)", lambda port: lspawn.spawn(fn, args=(port, NPROCS), nprocs=NPROCS)),
    ("torch.multiprocessing fork",
     lambda port: tmp.start_processes(fn, args=(port, NPROCS), nprocs=NPROCS, start_method="fork")),
    ("lspawn.spawn (fork)",
     lambda port: lspawn.spawn(fn, args=(port, NPROCS), nprocs=NPROCS, start_method="fork")),
    ("floor of the cold call: python -c 'import torch'", import_torch),
]


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    times = {name: [] for name, _ in CASES}
    times[FIRST] = [timed(CASES[1][1])]  # starts this process's daemon and its torch interpreter
    for _ in range(rounds):
        for name, call in CASES:
            times[name].append(timed(call))
    base = statistics.median(times[CASES[0][0]])
    print("%d processes, fn = init_process_group('gloo') + all_reduce; torch %s, lspawn %s, %d cores, %d rounds"
          % (NPROCS, torch.__version__, lspawn.__version__, os.cpu_count(), rounds))
    print("| call | median s | min s | vs torch.multiprocessing.spawn |")
    print("|---|---|---|---|")
    for name in [CASES[0][0], FIRST] + [n for n, _ in CASES[1:]]:
        med = statistics.median(times[name])
        print("| %s | %.3f | %.3f | %.2fx |" % (name, med, min(times[name]), med / base))


if __name__ == "__main__":
    main()
