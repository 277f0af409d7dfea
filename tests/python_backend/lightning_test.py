"""Lightning 2.x on the lspawn backend: DDPStrategy(process_group_backend="lspawn") fits, and an unmodified
strategy="ddp" script fits under `lspawn --cpu-backend lspawn`; both with their CPU collectives on shm.
Skipped (exit 77) where Lightning is not importable (Debian's torch 1.13: Lightning 2.x needs torch 2).
Needs LSPAWN_BIN."""
import os
import subprocess
import sys
import tempfile
import textwrap

try:
    import lightning  # noqa: F401
except ImportError as e:
    print("skipped: Lightning is not importable here (%s)" % e)
    sys.exit(77)

SCRIPT = textwrap.dedent("""
    import sys, torch, torch.nn as nn
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy
    EXPLICIT = sys.argv[1] == "explicit"
    if EXPLICIT:
        import lspawn.distributed
    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)
        def on_train_end(self):
            ld = sys.modules.get("lspawn.distributed")
            print("rank %d transport %s" % (self.global_rank, ld.transport() if ld else None), flush=True)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    strategy = DDPStrategy(process_group_backend="lspawn") if EXPLICIT else "ddp"
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(M(), torch.utils.data.DataLoader(data, batch_size=32))
""")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fit.py")
        with open(path, "w") as f:
            f.write(SCRIPT)
        for mode, extra in (("explicit", []), ("unmodified", ["--cpu-backend", "lspawn"])):
            argv = [os.environ["LSPAWN_BIN"]] + extra + ["--nprocs", "2", sys.executable, path, mode]
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, cwd=tmp)
            if p.returncode != 0 or p.stdout.count("transport shm") != 2:
                raise SystemExit("FAILED (%s): lspawn exited %d, output:\n%s" % (mode, p.returncode, p.stdout[-6000:]))
            print("%s: Lightning fit on shm, both ranks" % mode)


if __name__ == "__main__":
    main()
