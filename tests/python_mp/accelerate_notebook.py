"""accelerate's notebook_launcher through lspawn (lspawn.install()), as a notebook runs it: the training
function is defined in `__main__` (this file is fed on stdin by the test: a `__main__` without a file,
as a notebook's), 2 CPU processes, a real fit of a small regression with Accelerator's gloo group.

Each process writes "loss L0 -> L1, lspawn yes|no" to $ACCEL_TEST_DIR/rank.R (yes: it leads a process group
of its own, as lspawn's do and the agent's do not); the parent checks both ranks trained, in step (DDP: the
same gathered losses), through lspawn.
Exit 77: accelerate is not installed (scripts/setup-torch2.sh installs it into the 2.x venv).
"""
import os
import sys

try:
    import accelerate  # noqa: F401
except ImportError:
    print("accelerate is not installed: skipped")
    sys.exit(77)
import lspawn
import torch
from accelerate import Accelerator, notebook_launcher


def train(steps):
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.arange(1.0, 9.0) + 0.5
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    model, opt, data = accelerator.prepare(model, opt, data)
    losses = []
    for _ in range(steps):
        for xb, yb in data:
            loss = torch.nn.functional.mse_loss(model(xb).squeeze(-1), yb)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        losses.append(accelerator.gather(loss.detach()).mean().item())
    launched = "yes" if os.getpgid(0) == os.getpid() else "no"  # lspawn's processes lead their own group; the agent's do not
    with open(os.path.join(os.environ["ACCEL_TEST_DIR"], "rank.%d" % accelerator.process_index), "w") as f:
        f.write("loss %.4f -> %.4f, lspawn %s" % (losses[0], losses[-1], launched))


lspawn.install()
import torch.distributed.launcher.api as api  # noqa: E402
print("launcher:", "lspawn" if getattr(api.elastic_launch, "_lspawn", False) else "torch", flush=True)
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
os.environ["ACCEL_TEST_DIR"] = tempfile.mkdtemp(prefix="lspawn-accelerate-")
atexit.register(shutil.rmtree, os.environ["ACCEL_TEST_DIR"], ignore_errors=True)
notebook_launcher(train, args=(5,), num_processes=2)
lines = []
for r in range(2):
    with open(os.path.join(os.environ["ACCEL_TEST_DIR"], "rank.%d" % r)) as f:
        lines.append(f.read())
    print("rank %d: %s" % (r, lines[-1]), flush=True)
first, last = (float(v) for v in lines[0].split(",")[0].split()[1::2])
assert lines[0] == lines[1] and lines[0].endswith("lspawn yes") and last < first / 4, "not trained in step through lspawn"
print("notebook_launcher: 2 processes through lspawn, loss %.3f -> %.3f" % (first, last), flush=True)
