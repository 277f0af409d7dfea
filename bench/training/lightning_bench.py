"""Lightning's side of the time-to-first-step comparison (docs/benchmarks-training.md): the same
MLP 784-1024-1024-10, batch 64 per rank, SGD, synthetic data, CPU, gloo, as
`train_bench --spawn N` (lspawn's DDPSpawn). Run with the venv of bench/training/setup-lightning.sh:

    .deps/lightning/bin/python bench/training/lightning_bench.py --nprocs 2 [--strategy ddp_spawn|ddp_fork]

Prints one JSON line: seconds from `trainer.fit()` to the end of rank 0's first optimizer step
(CLOCK_MONOTONIC is system-wide, so the child's clock reads against the parent's), and to fit()'s return.
"""
import argparse
import json
import os
import tempfile
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as L


class Mlp(L.LightningModule):
    def __init__(self, marker):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
        self.marker = marker

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.nll_loss(F.log_softmax(self.net(x), 1), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx == 0 and self.global_rank == 0:
            with open(self.marker, "w") as f:
                f.write(repr(time.monotonic()))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--strategy", default="ddp_spawn")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    x = torch.randn(64 * a.nprocs * 2, 784)
    y = torch.randint(0, 10, (64 * a.nprocs * 2,))
    with tempfile.TemporaryDirectory() as d:
        marker = os.path.join(d, "first-step")
        model = Mlp(marker)
        trainer = L.Trainer(accelerator="cpu", devices=a.nprocs, strategy=a.strategy, max_epochs=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            default_root_dir=d)
        loader = DataLoader(TensorDataset(x, y), batch_size=64)
        t0 = time.monotonic()
        trainer.fit(model, loader)
        total = time.monotonic() - t0
        with open(marker) as f:
            first = float(f.read()) - t0
    print(json.dumps({"impl": "lightning-" + a.strategy, "lightning": L.__version__, "torch": torch.__version__,
                      "nprocs": a.nprocs, "fit_to_first_step_s": round(first, 3), "total_s": round(total, 3)}), flush=True)


if __name__ == "__main__":
    main()
