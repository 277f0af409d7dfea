"""A job on the torch.distributed backend `lspawn` from the installed wheel: argv[1] is the backend string
init_process_group gets ("lspawn", "cpu:lspawn,cuda:nccl", or "gloo" under `lspawn --cpu-backend lspawn`).
Prints each rank's sum and the transport ("shm": lspawn's engine carried the all_reduce)."""
import os
import sys

import torch
import torch.distributed as dist

backend = sys.argv[1]
if "lspawn" in backend:
    import lspawn.distributed  # noqa: F401  registers the backend
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group(backend)
t = torch.full((4096,), float(rank + 1))
dist.all_reduce(t)
ld = sys.modules.get("lspawn.distributed")
print("rank %d of %d: sum %d on %s" % (rank, world, int(t[0].item()), ld.transport() if ld else "gloo"), flush=True)
dist.destroy_process_group()
