"""FSDP2 (fully_shard over a CPU device mesh) on the lspawn backend gives gloo's weights.

2 ranks train one 3-layer MLP from one seed, each layer and the model fully_shard-ed, 5 SGD steps: once with
the default group on "cpu:lspawn", once on "gloo" (separate runs: FSDP2 takes the default group's mesh). FSDP2
calls all_gather_into_tensor and reduce_scatter_tensor, so every parameter passes through both ops; with two
ranks each sum is a + b, so the full parameters must be identical bit for bit (compared as bytes, and across
ranks). Skipped (77) on torch without FSDP2 (1.13), and on 2.4-2.6, where FSDP2 on CPU tensors fails with gloo
too (torch's error is printed).
"""
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def fully_shard_function():
    """FSDP2's fully_shard: torch.distributed.fsdp from 2.6, torch.distributed._composable.fsdp in 2.4 and 2.5."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def gloo_averages(dist):
    """Whether gloo's reduce_scatter_tensor(op=AVG) averages. FSDP2 reduce-scatters float32 gradients with
    AVG; gloo takes the op but returns the sum (measured: torch 2.4.1-2.8.0 give the sum, 2.9.1, 2.10.0, 2.15.0
    the average), so its weights are no reference there."""
    import torch
    n, r = dist.get_world_size(), dist.get_rank()
    out = torch.empty(1)
    dist.reduce_scatter_tensor(out, torch.full((n,), float(r + 1)), op=dist.ReduceOp.AVG)
    return out.item() == sum(range(1, n + 1)) / n


def sum_then_divide(dist):
    """The gloo reference where gloo's AVG gives the sum: FSDP2's reduce_scatter_tensor(AVG) run as SUM,
    then divided by the group's size (exact for 2 ranks, as lspawn's average is: a + b, then / 2)."""
    original = dist.reduce_scatter_tensor

    def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if op != dist.ReduceOp.AVG or async_op:
            return original(output, input, op=op, group=group, async_op=async_op)
        original(output, input, op=dist.ReduceOp.SUM, group=group)
        output.div_(dist.get_world_size(group))

    dist.reduce_scatter_tensor = reduce_scatter_tensor


def worker():
    import torch
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    fully_shard = fully_shard_function()
    backend = sys.argv[-1]
    dist = harness.init(backend)
    if backend == "gloo" and not gloo_averages(dist):
        sum_then_divide(dist)
        print("note: gloo's reduce_scatter_tensor(AVG) returns the sum in torch %s: the reference divides it"
              % torch.__version__)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(5):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    full = torch.cat([p.full_tensor().detach().flatten() for p in model.parameters()])
    import lspawn.distributed as ld
    print("%s transport %s digest %s" % (backend, ld.transport(), hashlib.sha256(full.numpy().tobytes()).hexdigest()[:16]))


def main():
    try:
        fully_shard_function()
    except Exception as e:  # ImportError; on Debian's 1.13 under Python 3.11, a dataclass error in torch.distributed.fsdp
        print("skipped: no FSDP2 in this torch (%s: %s)" % (type(e).__name__, e))
        sys.exit(77)
    digests = {}
    # gloo first: FSDP2 on CPU tensors fails inside torch itself up to 2.6 (2.6: FSDP2 asks the CPU's
    # Stream for record_event; 2.4: it initialises CUDA), whatever the backend. There, with no reference,
    # the case is skipped, showing torch's error; from 2.7 gloo's failure fails it.
    here = os.path.abspath(__file__)
    gloo = harness.run_ranks(here, 2, ["gloo"], timeout=300, check=harness.torch_release() >= (2, 7))
    if any(code != 0 for _, code, _ in gloo):
        last = [out.strip().splitlines()[-1] if out.strip() else "(no output)" for _, _, out in gloo]
        print("skipped: FSDP2 on CPU tensors fails with gloo in this torch, so it has no reference here: %s" % last)
        sys.exit(77)
    for backend, runs in (("gloo", gloo), ("cpu:lspawn", harness.run_ranks(here, 2, ["cpu:lspawn"], timeout=300))):
        for rank, _, out in runs:
            lines = out.strip().splitlines()
            for note in (l for l in lines if rank == 0 and l.startswith("note: ")):
                print(note)
            line = lines[-1]
            digests.setdefault(backend, set()).add(line.split()[-1])
            print(line)
            if backend == "cpu:lspawn" and "transport shm" not in line:
                raise SystemExit("FAILED: FSDP2's group is not on shm: " + line)
    if len(digests["cpu:lspawn"]) != 1 or digests["cpu:lspawn"] != digests["gloo"]:
        raise SystemExit("FAILED: FSDP2 weights differ: lspawn %s, gloo %s" % (digests["cpu:lspawn"], digests["gloo"]))
    print("FSDP2 on lspawn: the weights gloo gives, bit for bit")


if __name__ == "__main__":
    if "--worker" in sys.argv:
        harness.run_worker(worker)  # no interpreter teardown: gloo's can abort the rank (harness.py)
    else:
        main()
