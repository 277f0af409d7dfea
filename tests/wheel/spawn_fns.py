"""Functions for spawn_cases.py's lspawn.spawn() calls: module-level, so every start method can pickle them.

Each writes what it saw to files in `directory` (a private temporary directory of the case).
torch is imported inside the functions that need it only.
"""
import json
import os
import signal
import sys
import time


def _write(directory, name, value):
    tmp = os.path.join(directory, ".%s.%d" % (name, os.getpid()))
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, os.path.join(directory, name))


def record(i, directory, tag, extra):
    """The side effect that proves fn(i, *args) ran with this i and these args."""
    _write(directory, "ran.%d" % i, {"i": i, "tag": tag, "extra": extra, "pid": os.getpid()})


def sleep_then_record(i, directory, seconds):
    time.sleep(seconds)
    _write(directory, "ran.%d" % i, {"i": i, "pid": os.getpid()})


def raise_on_1(i, message):
    if i == 1:
        raise ValueError(message)
    time.sleep(30)


def exit_on_1(i, code):
    if i == 1:
        sys.exit(code)
    time.sleep(30)


def segv_on_1(i):
    if i == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(30)


def raise_1_now_0_later(i, directory):
    if i == 0:
        time.sleep(2)
        _write(directory, "late.0", {"pid": os.getpid()})  # only when rank 0 was not stopped
        raise RuntimeError("rank 0 failed late")
    raise ValueError("rank 1 failed first")


def pid_then_sleep(i, directory):
    _write(directory, "pid.%d" % i, os.getpid())
    time.sleep(60)


def environment(i, directory):
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    _write(directory, "env.%d" % i, {k: os.environ.get(k) for k in keys})


def gloo_all_reduce(i, directory):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    _write(directory, "sum.%d" % i, {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item()})
    dist.destroy_process_group()


def grandparent(i, directory, tag):
    """Writes the pid of this process's grandparent: with preload and warm=True, the interpreter that imported
    the modules (the daemon's forkserver: worker <- per-run server <- forkserver), the same for every call."""
    with open("/proc/%d/stat" % os.getppid()) as f:
        gp = int(f.read().rsplit(")", 1)[1].split()[1])
    _write(directory, "gp.%s.%d" % (tag, i), gp)


def hang_rank1(i, directory):
    """Rank 1 stops between two all_reduces (torchrun_env=True); the others wait in the second."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    _write(directory, "pid.%d" % i, os.getpid())
    if i == 1:
        time.sleep(600)
    dist.all_reduce(t)
