"""Every op of the torch.distributed backend `lspawn` against gloo's result, dtype by dtype, N = 1..4.

Each rank runs every case twice: on the default group (lspawn) and on a gloo group of the same ranks, from
the same inputs (small integers, so that every sum and product is exact in every dtype and the order of a
reduction cannot change a bit), and requires identical outputs. Where gloo refuses a case (ReduceOp.AVG,
reduce_scatter on torch 1.13, bool reductions), the result is compared with one computed locally from every
rank's inputs instead; so is reduce_scatter with AVG always, which gloo takes and sums in torch
2.4.1-2.8.0. Also: async ops and their futures, a subgroup, and the transport: shm on one host, shm+gloo on hosts simulated by LSPAWN_BACKEND_HOST_KEY (N = 4 as 2 + 2, N = 3 as 2 + 1, not contiguous);
and which ops went to gloo whole (lspawn.distributed.counts()): point to point only, and across hosts
gather, scatter and all_to_all.

    python ops_test.py [N ...] [--no-hosts]      (default 1 2 3 4, then the two host splits)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

FLOATS = ["float32", "float64", "float16", "bfloat16"]
HOSTS = bool(os.environ.get("LSPAWN_TEST_HOSTS"))
INTS = ["int8", "uint8", "int32", "int64"]
SHAPES = [(7,), (3, 100), (300001,)]  # one element count past the 1 MiB staging slot (float32)


def worker():
    import torch
    dist = harness.init()
    import lspawn.distributed as ld
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    failures = []
    checked = [0]
    refused = [0]  # cases gloo and lspawn both refuse (across hosts)

    def gen(r, shape, dtype, salt):
        g = torch.Generator().manual_seed(1000 * salt + r)
        dt = getattr(torch, dtype)
        if dtype == "bool":
            return torch.randint(0, 2, shape, generator=g).to(dt)
        lo = 0 if dtype == "uint8" else -3
        return torch.randint(lo, 4, shape, generator=g).to(dt)

    def same(name, ours, ref):
        checked[0] += 1
        ours = ours if isinstance(ours, (list, tuple)) else [ours]
        ref = ref if isinstance(ref, (list, tuple)) else [ref]
        for a, b in zip(ours, ref):
            if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
                failures.append("%s: lspawn %s != reference %s" % (name, a.flatten()[:8].tolist(), b.flatten()[:8].tolist()))
                return

    def alone(name, fn, make_args, local_ref):
        """fn(args, None) on lspawn's group; compares the first of args with local_ref()'s (where gloo's
        result is no reference)."""
        ours = make_args()
        try:
            fn(ours, None)
        except RuntimeError as e:
            failures.append("%s: lspawn refused (%s)" % (name, str(e).splitlines()[0][:160]))
            return
        same(name, ours[:1], local_ref())

    def both(name, fn, make_args, local_ref=None):
        """fn(args, group) runs the op in place on args; compares lspawn's args with gloo's (or local_ref())."""
        ours = make_args()
        try:
            fn(ours, None)
        except RuntimeError as e:
            # Across hosts the ops other than reductions are gloo's, and so are its refusals (torch 1.13's
            # gloo has no bfloat16 or bool): a refusal is right exactly where gloo refuses too.
            theirs = make_args()
            try:
                fn(theirs, gloo)
            except RuntimeError:
                if HOSTS:
                    refused[0] += 1
                    return
            failures.append("%s: lspawn refused (%s)" % (name, str(e).splitlines()[0][:160]))
            return
        theirs = make_args()
        try:
            fn(theirs, gloo)
        except (RuntimeError, ValueError) as e:
            if local_ref is None:
                failures.append("%s: gloo refused (%s) and there is no local reference" % (name, str(e)[:120]))
                return
            theirs = local_ref()
        same(name, ours, theirs)

    salt = 0
    ops = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
           "max": dist.ReduceOp.MAX}

    def fold(ts, opname):
        out = ts[0].clone()
        for t in ts[1:]:
            if opname == "sum":
                out = out + t if out.dtype != torch.bool else out | t
            elif opname == "product":
                out = out * t if out.dtype != torch.bool else out & t
            elif opname == "min":
                out = torch.minimum(out, t)
            else:
                out = torch.maximum(out, t)
        return out.to(ts[0].dtype)

    for dtype in FLOATS + INTS + ["bool"]:
        for shape in SHAPES:
            if shape[0] > 1000 and dtype not in ("float32", "int64"):
                continue
            for opname, op in ops.items():
                salt += 1
                s = salt
                every = lambda s=s: [gen(r, shape, dtype, s) for r in range(n)]  # noqa: E731
                both("all_reduce %s %s %s" % (dtype, opname, shape),
                     lambda a, g, op=op: dist.all_reduce(a[0], op=op, group=g),
                     lambda s=s: [gen(rank, shape, dtype, s)],
                     lambda opname=opname, every=every: [fold(every(), opname)])
                for root in sorted({0, n - 1}):
                    def reduce_case(a, g, op=op, root=root):
                        dist.reduce(a[0], dst=root, op=op, group=g)
                        if rank != root:
                            a[0] = torch.zeros_like(a[0])  # only the root's result is defined
                    both("reduce %s %s root %d" % (dtype, opname, root), reduce_case,
                         lambda s=s: [gen(rank, shape, dtype, s)],
                         lambda opname=opname, every=every, root=root: [fold(every(), opname) if rank == root
                                                                        else torch.zeros(shape, dtype=getattr(torch, dtype))])
            salt += 1
            s = salt
            if dtype in FLOATS:
                avg_ref = lambda s=s: [(fold([gen(r, shape, dtype, s) for r in range(n)], "sum") / n).to(getattr(torch, dtype))]  # noqa: E731
                both("all_reduce %s avg %s" % (dtype, shape), lambda a, g: dist.all_reduce(a[0], op=dist.ReduceOp.AVG, group=g),
                     lambda s=s: [gen(rank, shape, dtype, s)], avg_ref)
            for root in range(n):
                both("broadcast %s root %d %s" % (dtype, root, shape), lambda a, g, root=root: dist.broadcast(a[0], src=root, group=g),
                     lambda s=s: [gen(rank, shape, dtype, s)], lambda s=s, root=root: [gen(root, shape, dtype, s)])
            if shape[0] > 1000:
                continue
            every = lambda s=s: [gen(r, shape, dtype, s) for r in range(n)]  # noqa: E731
            both("all_gather %s %s" % (dtype, shape),
                 lambda a, g: dist.all_gather(a[1:], a[0], group=g),
                 lambda s=s: [gen(rank, shape, dtype, s)] + [torch.empty(shape, dtype=getattr(torch, dtype)) for _ in range(n)],
                 lambda s=s, every=every: [gen(rank, shape, dtype, s)] + every())
            gather_base = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
            both("all_gather_into_tensor %s %s" % (dtype, shape),
                 lambda a, g: gather_base(a[1], a[0], group=g),
                 lambda s=s: [gen(rank, shape, dtype, s), torch.empty((n * shape[0],) + shape[1:], dtype=getattr(torch, dtype))],
                 lambda s=s, every=every: [gen(rank, shape, dtype, s), torch.cat(every())])
            for root in sorted({0, n - 1}):
                def gather_case(a, g, root=root):
                    dist.gather(a[0], a[1:] if rank == root else None, dst=root, group=g)
                both("gather %s root %d" % (dtype, root), gather_case,
                     lambda s=s: [gen(rank, shape, dtype, s)] + [torch.zeros(shape, dtype=getattr(torch, dtype)) for _ in range(n)],
                     lambda s=s, every=every, root=root: [gen(rank, shape, dtype, s)] + (every() if rank == root else
                                                                                     [torch.zeros(shape, dtype=getattr(torch, dtype)) for _ in range(n)]))

                def scatter_case(a, g, root=root):
                    dist.scatter(a[0], a[1:] if rank == root else None, src=root, group=g)
                both("scatter %s root %d" % (dtype, root), scatter_case,
                     lambda s=s: [torch.zeros(shape, dtype=getattr(torch, dtype))] + [gen(100 + r, shape, dtype, s) for r in range(n)],
                     lambda s=s, root=root: [gen(100 + rank, shape, dtype, s)] + [gen(100 + r, shape, dtype, s) for r in range(n)])
            if dtype == "bool":
                continue
            # reduce_scatter: rank r's inputs[j] = gen(r*n+j); rank r gets the sum over ranks of inputs[r].
            both("reduce_scatter %s %s" % (dtype, shape),
                 lambda a, g: dist.reduce_scatter(a[0], a[1:], group=g),
                 lambda s=s: [torch.zeros(shape, dtype=getattr(torch, dtype))] + [gen(rank * n + j, shape, dtype, s) for j in range(n)],
                 lambda s=s: [fold([gen(r * n + rank, shape, dtype, s) for r in range(n)], "sum")] +
                 [gen(rank * n + j, shape, dtype, s) for j in range(n)])
            rs_base = getattr(dist, "reduce_scatter_tensor", None) or getattr(dist, "_reduce_scatter_base", None)
            both("reduce_scatter_tensor %s %s" % (dtype, shape),
                 lambda a, g: rs_base(a[0], a[1], group=g),
                 lambda s=s: [torch.zeros(shape, dtype=getattr(torch, dtype)),
                              torch.cat([gen(rank * n + j, shape, dtype, s) for j in range(n)])],
                 lambda s=s: [fold([gen(r * n + rank, shape, dtype, s) for r in range(n)], "sum"),
                              torch.cat([gen(rank * n + j, shape, dtype, s) for j in range(n)])])
            if dtype in FLOATS:
                # AVG, against the local result alone: gloo takes AVG in reduce_scatter and returns the sum
                # in torch 2.4.1-2.8.0 (measured; 2.9.1, 2.10.0 and 2.15.0 average), so its result is no reference.
                avg_ref = lambda s=s: [(fold([gen(r * n + rank, shape, dtype, s) for r in range(n)], "sum") / n)  # noqa: E731
                                       .to(getattr(torch, dtype))]
                alone("reduce_scatter %s avg %s" % (dtype, shape),
                      lambda a, g: dist.reduce_scatter(a[0], a[1:], op=dist.ReduceOp.AVG, group=g),
                      lambda s=s: [torch.zeros(shape, dtype=getattr(torch, dtype))] +
                      [gen(rank * n + j, shape, dtype, s) for j in range(n)], avg_ref)
                alone("reduce_scatter_tensor %s avg %s" % (dtype, shape),
                      lambda a, g: rs_base(a[0], a[1], op=dist.ReduceOp.AVG, group=g),
                      lambda s=s: [torch.zeros(shape, dtype=getattr(torch, dtype)),
                                   torch.cat([gen(rank * n + j, shape, dtype, s) for j in range(n)])], avg_ref)
            # all_to_all_single, even and uneven (rank r sends r+j+1 rows to rank j).
            both("all_to_all_single %s even" % dtype,
                 lambda a, g: dist.all_to_all_single(a[0], a[1], group=g),
                 lambda s=s: [torch.zeros((n * shape[0],) + shape[1:], dtype=getattr(torch, dtype)),
                              gen(rank, (n * shape[0],) + shape[1:], dtype, s)],
                 lambda s=s: [torch.cat([gen(r, (n * shape[0],) + shape[1:], dtype, s).chunk(n)[rank] for r in range(n)]),
                              gen(rank, (n * shape[0],) + shape[1:], dtype, s)])
            ins = [rank + j + 1 for j in range(n)]
            outs = [r + rank + 1 for r in range(n)]
            both("all_to_all_single %s uneven" % dtype,
                 lambda a, g: dist.all_to_all_single(a[0], a[1], outs, ins, group=g),
                 lambda s=s: [torch.zeros((sum(outs), 2), dtype=getattr(torch, dtype)), gen(rank, (sum(ins), 2), dtype, s)],
                 lambda s=s: [torch.cat([gen(r, (sum(r + j + 1 for j in range(n)), 2), dtype, s)
                                         .split([r + j + 1 for j in range(n)])[rank] for r in range(n)]),
                              gen(rank, (sum(ins), 2), dtype, s)])
            both("all_to_all %s" % dtype,
                 lambda a, g: dist.all_to_all(a[:n], a[n:], group=g),
                 lambda s=s: [torch.zeros((r + rank + 1, 3), dtype=getattr(torch, dtype)) for r in range(n)] +
                 [gen(rank * n + j, (rank + j + 1, 3), dtype, s) for j in range(n)],
                 lambda s=s: [gen(r * n + rank, (r + rank + 1, 3), dtype, s) for r in range(n)] +
                 [gen(rank * n + j, (rank + j + 1, 3), dtype, s) for j in range(n)])

    # Coalesced ops, a non-contiguous tensor, async work and its future, barrier, send/recv, a subgroup.
    a = [torch.arange(10, dtype=torch.float32) * (rank + 1), torch.arange(5, dtype=torch.float32) + rank]
    b = [t.clone() for t in a]
    if hasattr(dist, "all_reduce_coalesced"):
        dist.all_reduce_coalesced(a)
        dist.all_reduce_coalesced(b, group=gloo)
        same("all_reduce_coalesced", a, b)
    if hasattr(dist, "all_gather_coalesced"):
        outs_l = [[torch.empty_like(t) for t in a] for _ in range(n)]
        outs_g = [[torch.empty_like(t) for t in a] for _ in range(n)]
        dist.all_gather_coalesced(outs_l, a)
        dist.all_gather_coalesced(outs_g, a, group=gloo)
        same("all_gather_coalesced", [t for l in outs_l for t in l], [t for l in outs_g for t in l])
    for count in (1, 2, 5):  # fewer elements than, as many as, and one more than twice the ranks of a host
        one = torch.arange(count, dtype=torch.float64) + rank
        one_g = one.clone()
        dist.all_reduce(one)
        dist.all_reduce(one_g, group=gloo)
        same("all_reduce of %d element(s)" % count, one, one_g)
    nc = torch.arange(24, dtype=torch.float32).reshape(4, 6).t() * (rank + 1)
    nc_g = nc.clone().t().contiguous().t()
    dist.all_reduce(nc)
    dist.all_reduce(nc_g, group=gloo)
    same("all_reduce non-contiguous", nc, nc_g)
    t = torch.full((1000,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    work.wait()
    value = fut.wait()
    same("async all_reduce future", value[0] if isinstance(value, list) else value, torch.full((1000,), float(n * (n + 1) // 2)))
    dist.barrier()
    if n > 1:
        x = torch.full((6,), float(rank))
        y = torch.empty(6)
        if rank % 2 == 0:
            dist.send(x, (rank + 1) % n)
            dist.recv(y, (rank - 1) % n)
        else:
            dist.recv(y, (rank - 1) % n)
            dist.send(x, (rank + 1) % n)
        same("send/recv", y, torch.full((6,), float((rank - 1) % n)))
    members = sorted({0, n - 1})
    sub = dist.new_group(members, backend="cpu:lspawn" if harness.torch_major() >= 2 else "lspawn")
    if rank in members:
        z = torch.full((3,), float(rank + 1))
        dist.all_reduce(z, group=sub)
        same("subgroup all_reduce", z, torch.full((3,), float(sum(m + 1 for m in members))))
        hosts = os.environ.get("LSPAWN_TEST_HOSTS", "").split(",")
        want = "shm" if len(hosts) < n or len({hosts[m] for m in members}) == 1 else "shm+gloo"
        if ld.transport(sub) != want:
            failures.append("subgroup transport %r, expected %s" % (ld.transport(sub), want))
    expected = os.environ.get("LSPAWN_TEST_TRANSPORT", "shm")
    if ld.transport() != expected:
        failures.append("default group transport %r, expected %s" % (ld.transport(), expected))
    # Which path each op took: gloo whole only for point to point, and across hosts gather, scatter and
    # all_to_all; every other op of this test on lspawn's (the engine, with gloo between the hosts' leaders).
    counts = ld.counts()
    to_gloo = {"send", "recv"} | ({"gather", "scatter", "all_to_all", "all_to_all_single"} if expected == "shm+gloo" else set())
    if set(counts["gloo"]) - to_gloo:
        failures.append("handed to gloo whole: %s (only %s may be)" % (counts["gloo"], sorted(to_gloo)))
    ours = {"all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter", "barrier"}
    if ours - set(counts["lspawn"]):
        failures.append("not on lspawn's path: %s (counts %s)" % (sorted(ours - set(counts["lspawn"])), counts))
    # CPU tensors only: CUDA IPC never ran, and says so (tests/python_backend/cuda_test.py runs it on a GPU).
    if counts["cuda_ipc"] or ld.cuda_ipc() != "unused":
        failures.append("CUDA IPC on CPU tensors: %r, %s" % (ld.cuda_ipc(), counts["cuda_ipc"]))
    dist.destroy_process_group()
    if failures:
        print("rank %d: %d of %d checks failed:\n  %s" % (rank, len(failures), checked[0], "\n  ".join(failures[:40])))
        sys.exit(1)
    print("rank %d: %d checks passed%s" % (rank, checked[0], ", %d cases refused by gloo and lspawn alike" % refused[0]
                                         if refused[0] else ""))


def main():
    sizes = [int(a) for a in sys.argv[1:] if a.isdigit()] if any(a.isdigit() for a in sys.argv[1:]) else [1, 2, 3, 4]
    for n in sizes:
        results = harness.run_ranks(os.path.abspath(__file__), n, timeout=600)
        print("N=%d: %s" % (n, results[0][2].strip().splitlines()[-1]))
    if "--no-hosts" in sys.argv:
        return
    # Hosts simulated on this machine (LSPAWN_BACKEND_HOST_KEY): the reductions, broadcast, the all_gathers and
    # barrier on shm within a host and gloo between the hosts' leaders, gather, scatter and all_to_all through
    # gloo; N = 4 as 2 + 2, N = 3 as ranks {0, 2} + {1} (a host's ranks not contiguous, hosts of 2 and 1).
    for n, host_of in ((4, lambda r: "a" if r < 2 else "b"), (3, lambda r: "a" if r != 1 else "b")):
        results = harness.run_ranks(os.path.abspath(__file__), n, timeout=600,
                                    env={"LSPAWN_TEST_TRANSPORT": "shm+gloo",
                                         "LSPAWN_TEST_HOSTS": ",".join(host_of(r) for r in range(n))},
                                    rank_env=lambda r, host_of=host_of: {"LSPAWN_BACKEND_HOST_KEY": host_of(r)})
        print("N=%d on 2 hosts: %s" % (n, results[0][2].strip().splitlines()[-1]))


if __name__ == "__main__":
    if "--worker" in sys.argv:
        harness.run_worker(worker)  # no interpreter teardown: gloo's can abort the rank (harness.py)
    else:
        main()
