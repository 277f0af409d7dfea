"""The Lightning job of bench/launch/python_jobs.py: Lightning 2.6 DDP on the CPU (gloo), a tiny
linear model, a few optimizer steps on random data, under whichever launcher started it (Lightning
reads torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)."""
import os

import torch
import lightning as L

STEPS = int(os.environ.get("LSPAWN_BENCH_STEPS", "8"))


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 1)

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64 * STEPS, 32, generator=g), torch.randn(64 * STEPS, 1, generator=g))
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), strategy="ddp",
                        max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=32))
    if trainer.global_step != STEPS:
        raise SystemExit(f"lightning_fit.py: rank {trainer.global_rank}: {trainer.global_step} steps, expected {STEPS}")


if __name__ == "__main__":
    main()
