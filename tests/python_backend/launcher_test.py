"""The backend under the lspawn launcher: --cpu-backend lspawn, its refusals, and the hang report.

- `lspawn --cpu-backend lspawn --nprocs 2 python3 plain.py`: a script that only says
  init_process_group("gloo") runs its CPU collectives on lspawn's engine (transport shm on every rank); the job
  says so at start. The same with --preload torch. Without the option the same script stays on gloo (lspawn.distributed is never imported).
- `--cpu-backend nccl`: a usage error naming the option and the values (exit 2), nothing started.
- `lspawn --hang-timeout 3`: rank 1 sleeps instead of joining an all_reduce on the lspawn backend; the report
  names the op and the backend's group (lspawn:world) and the job exits 124.
- The same for an unmodified gloo DDP script under `--cpu-backend lspawn`, rank 1 late in its third step: the
  report names the gradient bucket's all_reduce, which DDP's C++ reducer issues (no Python function does), on
  every torch: the backend records its ops from C++. Under gloo alone such a hang is named only where torch's
  Flight Recorder reads gloo (2.8 on; docs/hang-diagnosis.md).

Needs LSPAWN_BIN (the lspawn program under test).
"""
import os
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

PLAIN = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.full((1000,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    assert t[0].item() == 3.0, t[0].item()
    ld = sys.modules.get("lspawn.distributed")
    print("rank %d transport %s" % (dist.get_rank(), ld.transport() if ld else "gloo-unchanged"), flush=True)
    dist.destroy_process_group()
""")

HANG = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist
    import lspawn.distributed
    dist.init_process_group("cpu:lspawn" if int(torch.__version__.split(".")[0]) >= 2 else "lspawn")
    t = torch.ones(10)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        time.sleep(60)
    dist.all_reduce(t)
""")

DDP_HANG = textwrap.dedent("""
    import time, torch, torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel
    dist.init_process_group("gloo")
    model = DistributedDataParallel(nn.Linear(8, 1))
    for step in range(3):
        if step == 2 and dist.get_rank() == 1:
            time.sleep(60)
        model(torch.randn(4, 8)).sum().backward()
""")


def lspawn(args, script, tmp):
    path = os.path.join(tmp, "script.py")
    with open(path, "w") as f:
        f.write(script)
    argv = [os.environ["LSPAWN_BIN"]] + args + [sys.executable, path]
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd=tmp)


def check(cond, what, proc):
    if not cond:
        raise SystemExit("FAILED: %s\n--- lspawn exited %d, output:\n%s" % (what, proc.returncode, proc.stdout))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        p = lspawn(["--cpu-backend", "lspawn", "--nprocs", "2"], PLAIN, tmp)
        check(p.returncode == 0, "--cpu-backend lspawn: the job failed", p)
        check(p.stdout.count("transport shm") == 2, "--cpu-backend lspawn: not every rank ran on shm", p)
        check("--cpu-backend lspawn" in p.stdout, "--cpu-backend lspawn: the job did not say so at start", p)
        print("--cpu-backend lspawn: both ranks on shm")
        p = lspawn(["--preload", "torch", "--cpu-backend", "lspawn", "--nprocs", "2"], PLAIN, tmp)
        check(p.returncode == 0 and p.stdout.count("transport shm") == 2, "--preload torch --cpu-backend lspawn: not shm", p)
        print("--preload torch --cpu-backend lspawn: both ranks on shm")
        p = lspawn(["--nprocs", "2"], PLAIN, tmp)
        check(p.returncode == 0 and p.stdout.count("transport gloo-unchanged") == 2, "without the option: not gloo", p)
        print("without it: gloo, lspawn.distributed not imported")
        p = lspawn(["--cpu-backend", "nccl", "--nprocs", "2"], PLAIN, tmp)
        check(p.returncode == 2 and "--cpu-backend" in p.stdout and "'nccl'" in p.stdout and "transport" not in p.stdout,
              "--cpu-backend nccl: not a usage error naming it", p)
        print("--cpu-backend nccl: %s" % [l for l in p.stdout.splitlines() if "--cpu-backend" in l][0])
        p = lspawn(["--hang-timeout", "3", "--nprocs", "2"], HANG, tmp)
        check(p.returncode == 124, "--hang-timeout: exit code %d, expected 124" % p.returncode, p)
        check("lspawn:world" in p.stdout and "all_reduce" in p.stdout, "the hang report does not name the backend's op", p)
        print("hang report: %s" % [l for l in p.stdout.splitlines() if "lspawn:world" in l][0].strip())
        p = lspawn(["--cpu-backend", "lspawn", "--hang-timeout", "3", "--nprocs", "2"], DDP_HANG, tmp)
        check(p.returncode == 124, "DDP under --cpu-backend lspawn, --hang-timeout: exit code %d, expected 124"
              % p.returncode, p)
        # Linear(8, 1): 8 weights and a bias, one bucket of 9 floats.
        check("waiting: rank 0 in all_reduce #" in p.stdout and "on group lspawn:world, 36 B" in p.stdout,
              "the hang report does not name the reducer's bucket all_reduce", p)
        check("behind: rank 1" in p.stdout, "the hang report does not name rank 1 as behind", p)
        print("DDP's reducer, hang report: %s" % [l for l in p.stdout.splitlines() if "waiting: rank 0" in l][0].strip())


if __name__ == "__main__":
    main()
