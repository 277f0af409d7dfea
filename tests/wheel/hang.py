"""Rank 1 stops between two all_reduces; the others wait in the second (lspawn --hang-timeout)."""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    time.sleep(600)
dist.all_reduce(t)
