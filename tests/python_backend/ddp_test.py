"""DDP over the lspawn backend gives the same weights as DDP over gloo.

2 ranks train two copies of one MLP from the same seed on the same data, 8 steps of SGD: one DDP on the default
group (lspawn), one on a gloo group (small buckets, so that several all_reduces overlap backward). With two ranks
every gradient sum is a + b, exact in any order, so the weights must be identical bit for bit; then they are
compared across the ranks too (broadcast from rank 0). The default comm hook reads each bucket's all_reduce from
Work.get_future(), so this also checks the futures the backend returns: complete ones (small buckets, run
inline), then, with LSPAWN_BACKEND_ASYNC_BYTES=1, futures completed by the backend's runner thread.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def worker():
    import torch
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist = harness.init()
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    ours = DDP(make(), bucket_cap_mb=0.01)
    theirs = DDP(make(), process_group=gloo, bucket_cap_mb=0.01)
    opt_a = torch.optim.SGD(ours.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(theirs.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(8):
        x = torch.randn(16, 32, generator=g)
        y = torch.randint(0, 4, (16,), generator=g)
        for model, opt in ((ours, opt_a), (theirs, opt_b)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    bad = [n for (n, a), (_, b) in zip(ours.module.named_parameters(), theirs.module.named_parameters())
           if not torch.equal(a, b)]
    flat = torch.cat([p.detach().flatten() for p in ours.module.parameters()])
    first = flat.clone()
    dist.broadcast(first, src=0)
    if bad or not torch.equal(flat, first):
        print("rank %d: weights differ from gloo's in %s; across ranks: %s" % (rank, bad, not torch.equal(flat, first)))
        sys.exit(1)
    moved = float((flat - torch.cat([p.detach().flatten() for p in make().parameters()])).abs().sum())
    print("rank %d: %d parameters identical to gloo's after 8 steps (they moved by %.3f)" % (rank, flat.numel(), moved))
    if moved == 0:
        sys.exit(2)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        harness.run_worker(worker)  # no interpreter teardown: gloo's can abort the rank (harness.py)
    else:
        # Then with every reduction on the backend's runner thread (the path of DDP's buckets >= 256 KiB).
        for env in ({}, {"LSPAWN_BACKEND_ASYNC_BYTES": "1"}):
            for r, c, out in harness.run_ranks(os.path.abspath(__file__), 2, timeout=180, env=env):
                print(env, out.strip().splitlines()[-1])
