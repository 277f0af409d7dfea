"""CUDA tensors through the lspawn backend: device to device by CUDA IPC on one host (docs/python-backend.md).

Needs a GPU: exits 77 (skipped) where torch sees none (every CI machine of this project). On a GPU machine
(scripts/gpu-python-check.sh), 2 ranks on one GPU (or one each, with two), init_process_group("lspawn"):

1. Every op CUDA IPC carries, on tensors below and above LSPAWN_SHM_CUDA_IPC_MIN_BYTES (2 MiB: the first are
   staged through host memory, the second go device to device), float32 / bfloat16 / int64, against the result
   computed here: all_reduce (SUM, MAX, AVG on floats, in place on a non-contiguous view too), broadcast from
   rank 1, all_gather, all_gather_into_tensor, reduce_scatter_tensor, reduce to rank 0 (the others' input
   unchanged). Then counts()["cuda_ipc"] names each of them and cuda_ipc() says "on": a run that staged
   everything fails, however right its results.
2. The same with LSPAWN_SHM_CUDA_IPC=0: the same results, and cuda_ipc() "unused", counts()["cuda_ipc"] empty.
3. DDP on CUDA over "lspawn" (buckets of 4 MiB: IPC) gives the same weights as over NCCL after 4 steps (over
   gloo on a machine with fewer GPUs than ranks: NCCL refuses two ranks on one GPU).
4. A rank that passes a CPU tensor where the other passes a CUDA one: both fail within seconds, naming the
   op; neither waits for the group's timeout.

With --dry-run (python_backend.cuda_dry_run, every machine): checks 1 and 3 on CPU tensors over cpu:lspawn (DDP
against gloo), so that the expected values and the comparisons stay right between GPU runs.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

SMALL, LARGE = 1024, 3 << 20  # elements: 4 KiB and 12 MiB of float32


DRY = "LSPAWN_TEST_CUDA_DRY_RUN"  # set: the same checks on CPU tensors (--dry-run), so that they stay right


def device():
    import torch
    if os.environ.get(DRY):
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())


def synchronize():
    import torch
    if not os.environ.get(DRY):
        torch.cuda.synchronize()


def init():
    import lspawn.distributed  # noqa: F401
    import torch
    if os.environ.get(DRY):
        return harness.init()  # cpu:lspawn (torch 1.13: lspawn)
    torch.cuda.set_device(device())
    return harness.init("lspawn")


def ops(failures):
    import torch
    import torch.distributed as dist
    rank, n, dev = dist.get_rank(), dist.get_world_size(), device()

    def same(what, got, want):
        if not torch.equal(got.cpu(), want.cpu()):
            diff = (got.cpu().double() - want.cpu().double()).abs().max().item() if got.shape == want.shape else "shape"
            failures.append("%s: differs from the expected (largest difference %s)" % (what, diff))

    def inputs(r, numel, dtype):  # rank r's input: small integers, exact in every dtype here, sums too
        return ((torch.arange(numel, device=dev) % 7) + r + 1).to(dtype)

    for numel in (SMALL, LARGE):
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            tag = "%s x %d" % (str(dtype).replace("torch.", ""), numel)
            every = [inputs(r, numel, dtype) for r in range(n)]
            ops_here = [("SUM", dist.ReduceOp.SUM, sum(e.double() for e in every).to(dtype)),
                        ("MAX", dist.ReduceOp.MAX, torch.stack(every).max(0).values)]
            if dtype.is_floating_point:
                ops_here.append(("AVG", dist.ReduceOp.AVG, (sum(e.double() for e in every) / n).to(dtype)))
            for name, op, want in ops_here:
                t = inputs(rank, numel, dtype)
                dist.all_reduce(t, op=op)
                same("all_reduce %s %s" % (name, tag), t, want)
            # In place on a non-contiguous view (a transposed matrix).
            side = 64 if numel == SMALL else 2048
            m = inputs(rank, side * side, dtype).view(side, side).t()
            dist.all_reduce(m)
            same("all_reduce of a transposed view %s" % tag, m,
                 sum(inputs(r, side * side, dtype).double() for r in range(n)).to(dtype).view(side, side).t())
            t = inputs(rank, numel, dtype) if rank == 1 else torch.zeros(numel, dtype=dtype, device=dev)
            dist.broadcast(t, src=1)
            same("broadcast from 1 %s" % tag, t, every[1])
            outs = [torch.empty(numel, dtype=dtype, device=dev) for _ in range(n)]
            dist.all_gather(outs, inputs(rank, numel, dtype))
            same("all_gather %s" % tag, torch.cat(outs), torch.cat(every))
            out = torch.empty(numel * n, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, inputs(rank, numel, dtype))
            same("all_gather_into_tensor %s" % tag, out, torch.cat(every))
            part = torch.empty(numel // n, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(part, inputs(rank, numel, dtype))
            same("reduce_scatter_tensor %s" % tag, part,
                 sum(e.double() for e in every).to(dtype).chunk(n)[rank])
            t = inputs(rank, numel, dtype)
            dist.reduce(t, dst=0)
            same("reduce to 0 %s" % tag, t, sum(e.double() for e in every).to(dtype) if rank == 0 else every[rank])
    synchronize()


def ddp(failures):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank, dev = dist.get_rank(), device()
    reference = "nccl" if torch.cuda.device_count() >= dist.get_world_size() else "gloo"
    group = dist.new_group(backend=reference)

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512)).to(dev)  # ~4 MiB of weights

    ids = [dev] if dev.type == "cuda" else None  # (a dry run of this test's checks on the CPU)
    ours = DDP(make(), device_ids=ids, bucket_cap_mb=4)
    theirs = DDP(make(), device_ids=ids, process_group=group, bucket_cap_mb=4)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, theirs)]
    g = torch.Generator(device=dev).manual_seed(100 + rank)
    for _ in range(4):
        x = torch.randn(32, 512, generator=g, device=dev)
        for model, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for (name, a), b in zip(ours.module.named_parameters(), theirs.module.parameters()):
        # Two ranks: every gradient sum is a + b, the same in any order; the reference's and ours agree to the bit.
        if not torch.equal(a, b):
            failures.append("DDP over lspawn and over %s differ in %s by %g" % (reference, name,
                                                                                (a - b).abs().max().item()))
    print("DDP over lspawn and over %s: the same weights" % reference)


def worker():
    import torch
    mode = sys.argv[sys.argv.index("--worker") + 1]
    dist = init()
    import lspawn.distributed as ld
    failures = []
    if mode == "mismatch":  # rank 1 passes a CPU tensor where rank 0 passes a CUDA one
        t = torch.ones(LARGE, device=device()) if dist.get_rank() == 0 else torch.ones(LARGE)
        start = time.monotonic()
        try:
            dist.all_reduce(t)
            torch.cuda.synchronize()
            print("mismatch: all_reduce returned")
            sys.exit(3)
        except RuntimeError as e:
            print("mismatch refused after %.1f s: %s" % (time.monotonic() - start, str(e).splitlines()[0]))
            sys.exit(0 if time.monotonic() - start < 30 else 4)
    ops(failures)
    counts, state = ld.counts(), ld.cuda_ipc()
    print("cuda_ipc: %s, counts %s" % (state, counts["cuda_ipc"]))
    if os.environ.get(DRY):  # CPU tensors: the expected values and DDP's comparison are what is checked
        if counts["cuda_ipc"] or state != "unused":
            failures.append("CUDA IPC on CPU tensors: %s %s" % (state, counts["cuda_ipc"]))
        ddp(failures)
    elif os.environ.get("LSPAWN_SHM_CUDA_IPC") == "0":
        if counts["cuda_ipc"] or state != "unused":
            failures.append("LSPAWN_SHM_CUDA_IPC=0, yet CUDA IPC: %s %s" % (state, counts["cuda_ipc"]))
    else:
        want = {"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce"}
        if state != "on" or want - set(counts["cuda_ipc"]):
            failures.append("CUDA IPC did not carry %s (state %r)" % (sorted(want - set(counts["cuda_ipc"])), state))
        ddp(failures)
    rank = dist.get_rank()
    dist.destroy_process_group()
    if failures:
        print("rank %d: %d failures:\n  %s" % (rank, len(failures), "\n  ".join(failures[:40])))
        sys.exit(1)
    print("all right")


def main():
    import torch
    here = os.path.abspath(__file__)
    if "--dry-run" in sys.argv:  # python_backend.cuda_dry_run: every machine
        for rank, _, out in harness.run_ranks(here, 2, ["ops"], env={DRY: "1"}, timeout=300):
            print("[dry run rank %d] %s" % (rank, out.strip().splitlines()[-1]))
        return
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("no CUDA device: skipped (scripts/gpu-python-check.sh runs it on a GPU machine)")
        sys.exit(harness.SKIP)
    for env in ({}, {"LSPAWN_SHM_CUDA_IPC": "0"}):
        for rank, _, out in harness.run_ranks(here, 2, ["ops"], env=env, timeout=300):
            print("[%s rank %d] %s" % (env or "IPC", rank, out.strip().splitlines()[-1]))
    for rank, _, out in harness.run_ranks(here, 2, ["mismatch"], timeout=120):
        print("[mismatch rank %d] %s" % (rank, out.strip().splitlines()[-1]))


if __name__ == "__main__":
    if "--worker" in sys.argv:
        harness.run_worker(worker)  # no interpreter teardown: gloo's can abort the rank (harness.py)
    else:
        main()
