"""Lightning's strategy="ddp_spawn" through lspawn (lspawn.install()): Lightning's own launcher
(_MultiProcessingLauncher) calls torch.multiprocessing.start_processes, reads
ProcessContext.processes, passes args as a list and a SimpleQueue of get_context("spawn") for the
results; with install() all of it is lspawn's. A real fit: 2 CPU processes, gloo, a small regression.

Each process checks that it is lspawn's (it leads a process group of its own, as torch's spawn children
do not); the parent that the launcher was lspawn's and that the weights Lightning sent back from rank 0
fit better than the initial ones. Exit 77: Lightning is not installed.
"""
import os
import sys

try:
    import lightning as L
except ImportError:
    print("lightning is not installed: skipped")
    sys.exit(77)
import lspawn
import torch


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.losses = []

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x).squeeze(-1), y)
        self.losses.append(loss.item())
        return loss

    def on_train_end(self):
        # lspawn's processes lead a process group of their own; torch's spawn children do not.
        if os.getpgid(0) != os.getpid():
            raise AssertionError("rank %d (pid %d) is not a process of lspawn's" % (self.global_rank, os.getpid()))
        print("rank %d: lspawn yes" % self.global_rank, flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data():
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.arange(1.0, 9.0) + 0.5
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)


if __name__ == "__main__":
    lspawn.install()
    import torch.multiprocessing as tmp
    model = Regression()
    trainer = L.Trainer(strategy="ddp_spawn", accelerator="cpu", devices=2, max_epochs=4, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    x, y = next(iter(data()))
    with torch.no_grad():
        before = torch.nn.functional.mse_loss(model.layer(x).squeeze(-1), y).item()
    trainer.fit(model, data())
    # Lightning's launcher moves the trained weights back from rank 0 through its queue.
    with torch.no_grad():
        after = torch.nn.functional.mse_loss(model.layer(x).squeeze(-1), y).item()
    launcher = "lspawn" if getattr(tmp.start_processes, "_lspawn", False) else "torch"
    print("fit: loss %.3f -> %.3f, launcher %s" % (before, after, launcher), flush=True)
    assert launcher == "lspawn" and after < before / 4, "the fit did not go through lspawn, or did not train"
