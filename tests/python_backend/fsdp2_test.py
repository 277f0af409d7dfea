"""FSDP2 (fully_shard over a CPU device mesh) on the lspawn backend gives gloo's weights.

2 ranks train one 3-layer MLP from one seed, each layer and the model fully_shard-ed, 5 SGD steps: once with
the default group on "cpu:lspawn", once on "gloo" (separate runs: FSDP2 takes the default group's mesh). FSDP2
calls all_gather_into_tensor and reduce_scatter_tensor, so every parameter passes through both ops; with two
ranks each sum is a + b, so the full parameters must be identical bit for bit (compared as bytes, and across
ranks). Skipped (77) on torch without FSDP2 (1.13).
"""
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def worker():
    import torch
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    backend = sys.argv[-1]
    dist = harness.init(backend)
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
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception as e:  # ImportError; on Debian's 1.13 under Python 3.11, a dataclass error in torch.distributed.fsdp
        print("skipped: no FSDP2 in this torch (%s: %s)" % (type(e).__name__, e))
        sys.exit(77)
    digests = {}
    for backend in ("cpu:lspawn", "gloo"):
        for _, _, out in harness.run_ranks(os.path.abspath(__file__), 2, [backend], timeout=300):
            line = out.strip().splitlines()[-1]
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
