"""An unmodified PyTorch script: runs the same under lspawn and under torchrun.

    lspawn --nprocs 2 /usr/bin/python3 examples/ddp_python.py

Debian's torch (1.13.1) lives under /usr/bin/python3. The env contract (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, ...) is all init_method="env://" needs.
"""
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)  # sum
    want = world * (world + 1) / 2
    ok = bool((t == want).all())
    print(f"python rank {rank}/{world} (local {os.environ.get('LOCAL_RANK')}): "
          f"allreduce sum = {t[0].item():g} {'ok' if ok else 'WRONG'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
