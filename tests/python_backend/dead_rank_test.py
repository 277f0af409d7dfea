"""A rank of the lspawn backend that dies mid-collective: the others fail within seconds, naming it.

3 ranks; rank 1 exits (code 7) instead of joining a 16 MiB all_reduce. Ranks 0 and 2 must raise from the
all_reduce within 10 s (the group's timeout is 60 s: only the engine's peer check can be this fast), with an
error that names rank 1 and says it died. Then the same with a rank stopped by SIGKILL in the middle of a
stream of all_reduces.

Across hosts (4 ranks as hosts {0, 1} and {2, 3}, LSPAWN_BACKEND_HOST_KEY): rank 3 exits. Rank 2, its host's
leader, names rank 3 dead; rank 0, the other leader, fails in the step between hosts with an error that says
so and names the hosts' leaders (gloo's own names only an address); rank 1 sees rank 0 leave. Both say that the
first failure in the group was rank 3's (the note rank 2 left in the store). All within 10 s.

The same, with the leaders catching their error and staying alive 15 s (a trainer that recovers: it catches,
then makes a new group): rank 0 must still fail within 10 s (rank 2 closes its connections between hosts when
its op fails; before, rank 0 waited in gloo for the group's 60 s), and so must rank 1, whose leader is alive
but has left the group (it says so in the shared segment). A leader's later op on the broken group fails at
once.

ProcessGroup.abort() (torch 2.x's _abort_process_group, torchft's way out): the last rank is alive but never
comes; the others' watchdog threads abort the group after 1 s; their all_reduce ends within seconds, not after
the group's 60 s, and a new group without it works (one host: 3 ranks; across hosts: 4 ranks as 2 hosts).

And the recovery itself: the survivors destroy the group and form a new one without the dead rank (on one
host: 3 ranks, rank 2 exits; across hosts: 4 ranks, rank 3 exits, a new group of hosts {0, 1} and {2}). Its
all_reduce is right and runs on lspawn's path.
"""
import datetime
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def worker():
    import torch
    dist = harness.init()
    rank = dist.get_rank()
    mode = sys.argv[sys.argv.index("--worker") + 1]
    t = torch.ones(4 << 20)
    dist.all_reduce(t)  # everybody is in
    if mode in ("hosts", "hosts-stay"):
        stay = mode == "hosts-stay"
        if rank == 3:
            os._exit(7)
        start = time.monotonic()
        try:
            for _ in range(1000):
                dist.all_reduce(t)
        except RuntimeError as e:
            took, text = time.monotonic() - start, str(e)
            print("rank %d: failed after %.2f s: %s" % (rank, took, text.splitlines()[0][:400]))
            first = "first failure in the group: rank 3 died (host 1), seen by rank 2"
            want = {0: ["between hosts failed", "leaders: ranks 0 (host 0), 2 (host 1)", first],
                    1: ["rank 0", "left the group" if stay else "died", first], 2: ["rank 3", "died"]}[rank]
            ok = took < 10 and all(w in text for w in want)
            if stay and rank in (0, 2):
                again = time.monotonic()
                try:
                    dist.all_reduce(t)
                    print("rank %d: a later all_reduce on the broken group passed" % rank)
                    ok = False
                except RuntimeError as e2:
                    print("rank %d: later op failed after %.2f s: %s" % (rank, time.monotonic() - again,
                                                                         str(e2).splitlines()[0][:300]))
                    ok = ok and time.monotonic() - again < 1
                sys.stdout.flush()
                time.sleep(15)  # alive, as a trainer that caught the error would be
            sys.exit(0 if ok else 3)
        print("rank %d: no error although rank 3 is gone" % rank)
        sys.exit(4)
    if mode in ("recover", "recover-hosts"):
        # A trainer that recovers (torchft's way): the survivors catch the failure, destroy the group and form
        # a new one without the dead rank, on a new prefix of the store. Its all_reduce must be right, on
        # lspawn's path (shm, or shm+gloo across the hosts that are left).
        import lspawn.distributed as ld
        n = dist.get_world_size()
        if rank == n - 1:
            os._exit(7)
        try:
            for _ in range(1000):
                dist.all_reduce(t)
            print("rank %d: no error although rank %d is gone" % (rank, n - 1))
            sys.exit(4)
        except RuntimeError:
            pass
        start = time.monotonic()
        dist.destroy_process_group()
        dist.init_process_group("cpu:lspawn" if harness.torch_major() >= 2 else "lspawn",
                                store=dist.PrefixStore("quorum1/", harness.client_store()), rank=rank,
                                world_size=n - 1, timeout=datetime.timedelta(seconds=60))
        x = torch.full((1 << 20,), float(rank + 1))
        dist.all_reduce(x)
        want = float(sum(range(1, n)))
        ok = bool((x == want).all())
        how = ld.transport()
        print("rank %d: a new group of %d in %.2f s after the failure: all_reduce %s (want %s) on %s" %
              (rank, n - 1, time.monotonic() - start, x[0].item(), want, how))
        dist.destroy_process_group()
        sys.exit(0 if ok and how == ("shm+gloo" if mode == "recover-hosts" else "shm") else 3)
    if mode in ("abort", "abort-hosts"):
        # torchft's way out of a group a peer holds up: the last rank is alive but never comes; the others wait
        # in an all_reduce, and a watchdog thread of each calls _abort_process_group() after 1 s. The all_reduce
        # must end within seconds (the group's timeout is 60 s), and a new group without the frozen rank must
        # work. Across hosts, within 3.5 s: a leader whose step between hosts fails after its own abort does not
        # wait the 3 s for a failure note that no death will write.
        import threading
        import lspawn.distributed as ld
        from torch.distributed import distributed_c10d as c10d
        n = dist.get_world_size()
        if rank == n - 1:
            time.sleep(12)
            sys.exit(0)
        threading.Timer(1.0, c10d._abort_process_group).start()
        start = time.monotonic()
        try:
            dist.all_reduce(t)
            print("rank %d: the all_reduce completed although rank %d never came" % (rank, n - 1))
            sys.exit(4)
        except RuntimeError as e:
            took, text = time.monotonic() - start, str(e)
        print("rank %d: aborted after %.2f s: %s" % (rank, took, text.splitlines()[0][:300]))
        dist.init_process_group("cpu:lspawn", store=dist.PrefixStore("quorum1/", harness.client_store()), rank=rank,
                                world_size=n - 1, timeout=datetime.timedelta(seconds=60))
        x = torch.full((1 << 20,), float(rank + 1))
        dist.all_reduce(x)
        hosts = mode == "abort-hosts"
        ok = (took < (3.5 if hosts else 10) and ("aborted while waiting" in text or "between hosts failed" in text)
              and bool((x == float(sum(range(1, n)))).all()) and ld.transport() == ("shm+gloo" if hosts else "shm"))
        print("rank %d: a new group of %d: all_reduce %s on %s" % (rank, n - 1, x[0].item(), ld.transport()))
        dist.destroy_process_group()
        sys.exit(0 if ok else 3)
    if rank == 1:
        if mode == "exit":
            os._exit(7)
        for _ in range(3):
            dist.all_reduce(t)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        for _ in range(1000):
            dist.all_reduce(t)
    except RuntimeError as e:
        took = time.monotonic() - start
        text = str(e)
        print("rank %d: failed after %.2f s: %s" % (rank, took, text.splitlines()[0][:300]))
        ok = took < 10 and "rank 1" in text and ("died" in text or "dead" in text or "exited" in text)
        sys.exit(0 if ok else 3)
    print("rank %d: no error although rank 1 is gone" % rank)
    sys.exit(4)


def main():
    for mode, code in (("exit", 7), ("kill", -signal.SIGKILL)):
        start = time.monotonic()
        results = harness.run_ranks(os.path.abspath(__file__), 3, [mode], timeout=60, expect={0: 0, 1: code, 2: 0})
        for r, c, out in results:
            if r != 1:
                print("%s: %s" % (mode, out.strip().splitlines()[-1]))
        print("%s: whole run %.1f s" % (mode, time.monotonic() - start))
    results = harness.run_ranks(os.path.abspath(__file__), 4, ["hosts"], timeout=60, expect={0: 0, 1: 0, 2: 0, 3: 7},
                                rank_env=lambda r: {"LSPAWN_BACKEND_HOST_KEY": "host%d" % (r // 2)})
    for r, c, out in results:
        if r != 3:
            print("hosts: %s" % out.strip().splitlines()[-1])
    results = harness.run_ranks(os.path.abspath(__file__), 4, ["hosts-stay"], timeout=60,
                                expect={0: 0, 1: 0, 2: 0, 3: 7},
                                rank_env=lambda r: {"LSPAWN_BACKEND_HOST_KEY": "host%d" % (r // 2)})
    for r, c, out in results:
        if r != 3:
            print("hosts-stay: %s" % " | ".join(out.strip().splitlines()[-2:]))
    import torch
    import lspawn.distributed as ld
    if not ld.supports_abort():  # torch < 2.7: no Backend::abort() for ProcessGroup.abort() to call
        print("abort: skipped, torch %s's ProcessGroup.abort() does not reach a backend" % torch.__version__)
    else:
        for mode, n, rank_env in (("abort", 3, None),
                                  ("abort-hosts", 4, lambda r: {"LSPAWN_BACKEND_HOST_KEY": "host%d" % (r // 2)})):
            for r, c, out in harness.run_ranks(os.path.abspath(__file__), n, [mode], timeout=60, rank_env=rank_env):
                if r != n - 1:
                    print("%s: %s" % (mode, " | ".join(out.strip().splitlines()[-2:])))
    for mode, n, rank_env in (("recover", 3, None),
                              ("recover-hosts", 4, lambda r: {"LSPAWN_BACKEND_HOST_KEY": "host%d" % (r // 2)})):
        expect = {r: 0 for r in range(n - 1)}
        expect[n - 1] = 7
        results = harness.run_ranks(os.path.abspath(__file__), n, [mode], timeout=60, expect=expect,
                                    rank_env=rank_env)
        for r, c, out in results:
            if r != n - 1:
                print("%s: %s" % (mode, out.strip().splitlines()[-1]))


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        main()
