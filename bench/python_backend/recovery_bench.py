"""A rank dies mid-training and the others recover: how long the survivors take, `lspawn` against gloo.

N ranks (default 4) all_reduce 4 MiB in a loop; rank N-1 writes its CLOCK_MONOTONIC time into the store and
exits (code 7) in the middle of the loop. Each survivor catches the error of its all_reduce and then, by --mode:
  stay     keeps its group (and its process) for --stay seconds before it destroys it, as a trainer that
           handles the error slowly, or not at all, would: how long do the *others* wait for their error?
  recover  destroys the group at once and forms a new one of N-1 ranks on a new prefix of the store
           (torchft's way), then all_reduces: how long until every survivor trains again?
  abort    rank N-1 does not die: it stays alive without calling the all_reduce for --stay seconds (a frozen
           peer). A watchdog thread of each survivor calls torch's _abort_process_group() 1 s into the wait
           (torchft's way out; torch 2.x), then recovers as `recover` does. Times are from the start of the
           survivors' wait: how long does an abort take to free them?
Times are from the death (the dead rank's clock reading; CLOCK_MONOTONIC is one clock for every process of
the machine). The group's timeout is --timeout s: a survivor that waits for it is held up by a peer that
caught the error and lives on. Layouts: lspawn on one host, and 2 simulated hosts (LSPAWN_BACKEND_HOST_KEY:
ranks {0, 1} and {2, 3}, the step between hosts over gloo); gloo is flat whatever the layout.

    python recovery_bench.py [--nprocs 4] [--backends lspawn,gloo] [--modes stay,recover,abort] [--stay 10]
                             [--timeout 30] [--json OUT]
Env: PYTHONPATH with the source tree's python/, LSPAWN_ENGINE, LSPAWN_BACKEND_SHIM_DIR (as ddp_bench.py).
"""
import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python_backend"))
import harness  # noqa: E402  (the rank starter the backend's tests use)


def backend_name(backend):
    if backend == "gloo":
        return "gloo"
    return "cpu:lspawn" if harness.torch_major() >= 2 else "lspawn"


def worker(args):
    import lspawn.distributed  # noqa: F401  (registers the backend)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend, mode = os.environ["BENCH_BACKEND"], os.environ["BENCH_MODE"]
    store = harness.client_store()
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group(backend_name(backend), store=dist.PrefixStore("g0/", store), rank=rank, world_size=n,
                            timeout=timeout)
    t = torch.ones(1 << 20)
    for _ in range(3):
        dist.all_reduce(t)
    if mode == "abort":
        import threading
        from torch.distributed import distributed_c10d as c10d
        if rank == n - 1:
            store.set("bench/died", repr(time.monotonic()))
            time.sleep(args.stay)  # frozen: alive, never comes
            os._exit(7)
        threading.Timer(1.0, c10d._abort_process_group).start()
    elif rank == n - 1:
        store.set("bench/died", repr(time.monotonic()))
        os._exit(7)
    error = None
    waiting = time.monotonic()
    try:
        for _ in range(100000):
            dist.all_reduce(t)
    except RuntimeError as e:
        error = str(e).splitlines()[0][:160]
    failed_at = time.monotonic()
    died = waiting if mode == "abort" else float(store.get("bench/died").decode())
    row = {"backend": backend, "layout": os.environ["BENCH_LAYOUT"], "mode": mode, "nprocs": n, "rank": rank,
           "to_error": failed_at - died, "error": error}
    if mode == "stay":
        time.sleep(max(0.0, args.stay - (time.monotonic() - died)))
        dist.destroy_process_group()
    else:
        if mode != "abort":  # _abort_process_group() has destroyed it
            dist.destroy_process_group()
        dist.init_process_group(backend_name(backend), store=dist.PrefixStore("g1/", store), rank=rank,
                                world_size=n - 1, timeout=timeout)
        x = torch.full((1 << 20,), float(rank + 1))
        dist.all_reduce(x)
        row["to_new_group"] = time.monotonic() - died
        row["new_group_right"] = bool((x == float(sum(range(1, n)))).all())
        dist.destroy_process_group()
    print(json.dumps(row), flush=True)


def run(backend, layout, mode, args):
    n = args.nprocs
    rank_env = None
    if layout == "2 hosts":
        rank_env = lambda r: {"LSPAWN_BACKEND_HOST_KEY": "host%d" % (r * 2 // n)}  # noqa: E731
    results = harness.run_ranks(os.path.abspath(__file__), n, ["--stay", str(args.stay), "--timeout",
                                                                str(args.timeout)],
                                timeout=args.timeout + args.stay + 60, check=False, rank_env=rank_env,
                                env={"BENCH_BACKEND": backend, "BENCH_MODE": mode, "BENCH_LAYOUT": layout})
    rows = []
    for rank, code, out in results:
        got = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if rank != n - 1 and (code != 0 or not got):
            print("---- %s %s %s rank %d (exit %s) ----\n%s" % (backend, layout, mode, rank, code,
                                                              "\n".join(out.strip().splitlines()[-15:])),
                  file=sys.stderr)
        rows += got
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--backends", default="lspawn,gloo")
    ap.add_argument("--modes", default="stay,recover,abort")
    ap.add_argument("--stay", type=float, default=10.0)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    import torch
    runs = []
    for mode in args.modes.split(","):
        for backend in args.backends.split(","):
            for layout in (["one host", "2 hosts"] if backend == "lspawn" else ["flat"]):
                runs.append((backend, layout, mode))
    print("torch %s, N = %d, 4 MiB all_reduce, rank %d exits; group timeout %g s, --stay %g s"
          % (torch.__version__, args.nprocs, args.nprocs - 1, args.timeout, args.stay))
    print()
    print("| mode | backend | layout | survivors' error after the death (s) | every survivor in a new group (s) "
          "| first error (rank 0) |")
    print("|---|---|---|---|---|---|")
    every = []
    import lspawn.distributed
    if "abort" in args.modes.split(",") and not lspawn.distributed.supports_abort():
        print("(abort: skipped, torch %s's ProcessGroup.abort() does not reach a backend)" % torch.__version__)
        runs = [r for r in runs if r[2] != "abort"]
    for backend, layout, mode in runs:
        rows = run(backend, layout, mode, args)
        every += rows
        errs = sorted(r["to_error"] for r in rows)
        err_cell = "%.2f-%.2f" % (errs[0], errs[-1]) if errs else "none"
        if len(rows) < args.nprocs - 1:
            err_cell += " (%d of %d survivors reported)" % (len(rows), args.nprocs - 1)
        new = ""
        if mode in ("recover", "abort"):
            news = [r.get("to_new_group") for r in rows if r.get("new_group_right")]
            new = "%.2f" % max(news) if len(news) == args.nprocs - 1 else "not every survivor (%d)" % len(news)
        first = next((r["error"] for r in rows if r["rank"] == 0), "") or ""
        print("| %s | %s | %s | %s | %s | `%s` |" % (mode, backend, layout, err_cell, new,
                                                  first[:90].replace("|", "/")), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(every, f, indent=1)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        harness.run_worker(lambda: main())
    else:
        main()
