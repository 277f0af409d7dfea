"""A torchrun-style job: RANK/WORLD_SIZE/MASTER_* from the launcher, a gloo all_reduce of the ranks.
--no-torch: only the environment (a venv without torch, or a --preload of another module)."""
import os
import sys

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if "--no-torch" in sys.argv:
    print("rank %d of %d: ok" % (rank, world), flush=True)
    sys.exit(0)
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(rank)])
dist.all_reduce(t)
print("rank %d of %d: sum %d" % (rank, world, int(t.item())), flush=True)
dist.destroy_process_group()
