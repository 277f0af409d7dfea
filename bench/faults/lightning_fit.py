"""A small unmodified Lightning DDP fit (CPU, strategy="ddp", gloo): the job of exit_abort.sh. Each rank prints
its last line (`rank R done loss L`) after fit() and returns from the script; nothing else runs after it."""
import torch
import torch.nn as nn
import lightning as L


class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, i):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.last = float(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
model = M()
trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=32))
print("rank %d done loss %.4f" % (trainer.global_rank, model.last), flush=True)
