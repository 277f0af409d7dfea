"""lspawn.spawn()'s cases, for an installed lspawn: `python spawn_cases.py` (no pytest).

Each case runs with every start method it applies to: fork, spawn, forkserver, and spawn with
preload=["torch"] ("preload"). One line per case: "ok CASE", "skip CASE: why" (the torch cases
when `import torch` fails), or "FAIL CASE" and the traceback; then "N passed, N failed"; the exit
code is 1 when a case failed. The functions the processes run are in spawn_fns.py beside this
file (one, main_record, is defined here: a function of the parent's __main__ must work too).

Every run's private directory goes under a temporary folder of this script (tempfile.tempdir),
which must be empty again after each case. Ports are free ones; paths are temporary.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import lspawn
import spawn_fns as F

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = {"fork": {"start_method": "fork"}, "spawn": {"start_method": "spawn"},
           "forkserver": {"start_method": "forkserver"},
           "preload": {"start_method": "spawn", "preload": ["torch"]}}
LAUNCHED = ("spawn", "forkserver", "preload")  # the methods that pickle fn


class Skip(Exception):
    pass


def main_record(i, directory):
    with open(os.path.join(directory, "main.%d" % i), "w") as f:
        f.write(__name__)


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def expect(exc_type, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        return e
    raise AssertionError("%s(...) raised no %s" % (getattr(fn, "__name__", fn), exc_type.__name__))


def read(directory, name):
    with open(os.path.join(directory, name)) as f:
        return json.load(f)


def alive(pid):
    """Whether pid is a process that is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def children():
    """This process's child processes."""
    found = []
    for task in os.listdir("/proc/self/task"):
        with open("/proc/self/task/%s/children" % task) as f:
            found += [int(p) for p in f.read().split()]
    return found


def reserve_port():
    """A socket holding a free port (SO_REUSEADDR, bound, never listening) until it is closed: nobody
    else's bind(0) gets the port meanwhile, a TCPStore can still listen on it (no probe-then-close race)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


def need_torch(method):
    if method == "preload" and not HAVE_TORCH:
        raise Skip("no torch")


# -- the cases: each takes the method's name and a fresh private directory -------------------------

def case_returns(method, d):
    need_torch(method)
    out = lspawn.spawn(F.record, args=(d, "tag", {"k": [1, 2]}), nprocs=2, **METHODS[method])
    check(out == [None, None], "spawn(join=True) returned %r, not [None, None] (fn returns None)" % (out,))
    for i in range(2):
        got = read(d, "ran.%d" % i)
        check(got["i"] == i and got["tag"] == "tag" and got["extra"] == {"k": [1, 2]},
              "process %d ran fn with %r" % (i, got))


def case_lambda_fork(method, d):
    path = os.path.join(d, "closure")
    lspawn.spawn(lambda i: open("%s.%d" % (path, i), "w").close(), nprocs=2, start_method="fork")
    check(all(os.path.exists("%s.%d" % (path, i)) for i in range(2)), "the lambda did not run in both processes")


def case_main_function(method, d):
    lspawn.spawn(main_record, args=(d,), nprocs=2, **METHODS[method])
    for i in range(2):
        with open(os.path.join(d, "main.%d" % i)) as f:
            name = f.read()
        check(name == "__mp_main__", "process %d ran __main__'s function as module %r" % (i, name))


def case_context(method, d):
    need_torch(method)
    ctx = lspawn.spawn(F.sleep_then_record, args=(d, 1.5), nprocs=2, join=False, **METHODS[method])
    check(isinstance(ctx, lspawn.ProcessContext), "join=False returned %r" % (ctx,))
    pids = ctx.pids()
    check(len(set(pids)) == 2 and all(isinstance(p, int) and p > 0 for p in pids), "pids() = %r" % (pids,))
    check(all(alive(p) for p in pids), "pids() %r are not all alive" % (pids,))
    check(ctx.join(timeout=0.01) is False, "join(timeout=0.01) is not False while the processes sleep")
    deadline = time.monotonic() + 60
    while not ctx.join(timeout=0.5):
        check(time.monotonic() < deadline, "the processes did not end within 60 s")
    check(ctx.join() is True, "join() after the end is not True")
    for i in range(2):
        check(read(d, "ran.%d" % i)["pid"] == pids[i], "pids()[%d] is not the process that ran fn(%d)" % (i, i))


def case_raises(method, d):
    need_torch(method)
    e = expect(lspawn.ProcessRaisedException, lspawn.spawn, F.raise_on_1, args=("boom-7f3a",), nprocs=2,
               grace_period=1, **METHODS[method])
    check(isinstance(e, lspawn.ProcessException), "%r is not a ProcessException" % e)
    check(e.error_index == 1, "error_index %r, not 1" % e.error_index)
    check(isinstance(e.error_pid, int) and e.error_pid > 0 and e.pid == e.error_pid, "error_pid %r" % e.error_pid)
    msg = str(e)
    check(msg.startswith("\n\n-- Process 1 terminated with the following error:\n"), "message %r" % msg)
    check("ValueError: boom-7f3a" in msg and "raise_on_1" in msg, "no traceback of the ValueError in %r" % msg)


def case_exit_code(method, d):
    need_torch(method)
    e = expect(lspawn.ProcessExitedException, lspawn.spawn, F.exit_on_1, args=(3,), nprocs=2, grace_period=1,
               **METHODS[method])
    check((e.error_index, e.exit_code, e.signal_name) == (1, 3, None),
          "error_index, exit_code, signal_name = %r" % ((e.error_index, e.exit_code, e.signal_name),))
    check(str(e) == "process 1 terminated with exit code 3", "message %r" % str(e))


def case_signal(method, d):
    need_torch(method)
    e = expect(lspawn.ProcessExitedException, lspawn.spawn, F.segv_on_1, nprocs=2, grace_period=1,
               **METHODS[method])
    check((e.error_index, e.signal_name, e.exit_code) == (1, "SIGSEGV", -signal.SIGSEGV),
          "error_index, signal_name, exit_code = %r" % ((e.error_index, e.signal_name, e.exit_code),))
    check(str(e) == "process 1 terminated with signal SIGSEGV", "message %r" % str(e))


def case_root_cause(method, d):
    need_torch(method)
    e = expect(lspawn.ProcessRaisedException, lspawn.spawn, F.raise_1_now_0_later, args=(d,), nprocs=2,
               **METHODS[method])
    check(e.error_index == 1 and "rank 1 failed first" in str(e), "root cause %d: %s" % (e.error_index, e))
    check(not os.path.exists(os.path.join(d, "late.0")), "process 0 was not stopped: it reached its late failure")


ORPHAN_PARENT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import lspawn, spawn_fns
lspawn.spawn(spawn_fns.pid_then_sleep, args=(sys.argv[2],), nprocs=2, **json.loads(sys.argv[3]))
"""


def case_parent_killed(method, d):
    need_torch(method)
    tmp = tempfile.mkdtemp(dir=d)
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN_PARENT, HERE, d, json.dumps(METHODS[method])],
                              env=dict(os.environ, TMPDIR=tmp))
    try:
        deadline = time.monotonic() + 60
        while not all(os.path.exists(os.path.join(d, "pid.%d" % i)) for i in range(2)):
            check(parent.poll() is None, "the parent exited with %r before its processes started" % parent.returncode)
            check(time.monotonic() < deadline, "the processes did not start within 60 s")
            time.sleep(0.05)
        pids = [read(d, "pid.%d" % i) for i in range(2)]
        check(all(alive(p) for p in pids), "processes %r are not running" % (pids,))
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) or os.listdir(tmp):
        if time.monotonic() > deadline:
            raise AssertionError("5 s after the parent's SIGKILL: processes %r alive, run directory left: %r"
                                 % ([p for p in pids if alive(p)], os.listdir(tmp)))
        time.sleep(0.05)


def case_torchrun_env(method, d):
    need_torch(method)
    lspawn.spawn(F.environment, args=(d,), nprocs=2, torchrun_env=True, **METHODS[method])
    envs = [read(d, "env.%d" % i) for i in range(2)]
    for i, env in enumerate(envs):
        check(env["RANK"] == env["LOCAL_RANK"] == str(i) and env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
              and env["MASTER_ADDR"] and env["MASTER_PORT"], "process %d's environment %r" % (i, env))
    check(envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"], "MASTER_PORTs differ: %r" % (envs,))


def case_gloo(method, d):
    if not HAVE_TORCH:
        raise Skip("no torch")
    lspawn.spawn(F.gloo_all_reduce, args=(d,), nprocs=2, torchrun_env=True, **METHODS[method])
    for i in range(2):
        got = read(d, "sum.%d" % i)
        check(got == {"rank": i, "world": 2, "sum": 3.0}, "process %d: all_reduce gave %r" % (i, got))


def case_hang(method, d):
    """hang_timeout: the launcher's hang report, then RuntimeError naming exit 124; no process left."""
    if not HAVE_TORCH:
        raise Skip("no torch")
    started = time.monotonic()
    try:
        lspawn.spawn(F.hang_rank1, args=(d,), nprocs=2, torchrun_env=True, hang_timeout=2, **METHODS[method])
    except RuntimeError as e:
        check("124" in str(e) and "hang" in str(e), "the hang raised %r" % (e,))
    else:
        raise AssertionError("a hang with hang_timeout=2 returned")
    check(time.monotonic() - started < 60, "the hang took %.0f s to be reported" % (time.monotonic() - started))
    pids = [read(d, "pid.%d" % i) for i in range(2)]
    check(not any(alive(p) for p in pids), "processes %r alive after the hang report" % (pids,))


def case_parent_env(method, d):
    need_torch(method)
    saved = os.environ.get("MASTER_PORT")
    port = reserve_port()
    os.environ["MASTER_PORT"] = str(port.getsockname()[1])  # as the tutorials set it before mp.spawn
    parent = {k: os.environ.get(k) for k in ("MASTER_PORT", "RANK", "WORLD_SIZE", "MASTER_ADDR")}
    try:
        lspawn.spawn(F.environment, args=(d,), nprocs=2, **METHODS[method])
    finally:
        port.close()
        if saved is None:
            del os.environ["MASTER_PORT"]
        else:
            os.environ["MASTER_PORT"] = saved
    for i in range(2):
        env = read(d, "env.%d" % i)
        for k, value in parent.items():
            check(env[k] == value, "process %d: %s=%r, the parent's is %r" % (i, k, env[k], value))

def case_bad_input(method, d):
    e = expect(ValueError, lspawn.spawn, F.record, nprocs=0)
    check("nprocs" in str(e), "nprocs=0: %s" % e)
    e = expect(ValueError, lspawn.spawn, F.record, nprocs=2, start_method="bogus")
    check("bogus" in str(e) and all(m in str(e) for m in ("fork", "spawn", "forkserver")), "start_method: %s" % e)
    # A lambda travels by value with cloudpickle (the [notebook] extra; Debian's python3-cloudpickle here),
    # without it a TypeError naming fn and the extra; an object nothing pickles (a generator) is refused either way.
    import importlib.util
    if importlib.util.find_spec("cloudpickle") is None:
        for m in ("spawn", "forkserver"):
            e = expect(TypeError, lspawn.spawn, lambda i: None, nprocs=2, start_method=m)
            check("fn" in str(e) and "lspawn[notebook]" in str(e), "a lambda under %s: %s" % (m, e))
    e = expect(TypeError, lspawn.spawn, F.record, args=((x for x in ()),), nprocs=2)
    check("args" in str(e) and "generator" in str(e), "an unpicklable argument: %s" % e)
    e = expect(ValueError, lspawn.spawn, F.record, nprocs=2, start_method="fork", preload=["torch"])
    check("preload" in str(e), "preload with fork: %s" % e)
    expect(TypeError, lspawn.spawn, F.record, nprocs=2, preload="torch")
    check(not children(), "a process was started: %r" % children())


def case_warm(method, d):
    """preload/forkserver keep their interpreter between calls (warm=True, the default); warm=False does not."""
    need_torch(method)
    for tag in ("a", "b"):
        lspawn.spawn(F.grandparent, args=(d, tag), nprocs=2, **METHODS[method])
    lspawn.spawn(F.grandparent, args=(d, "cold"), nprocs=2, warm=False, **METHODS[method])
    warm = {read(d, "gp.%s.%d" % (tag, i)) for tag in ("a", "b") for i in range(2)}
    cold = {read(d, "gp.cold.%d" % i) for i in range(2)}
    check(len(warm) == 1, "two warm calls forked from different interpreters: %r" % (warm,))
    check(len(cold) == 1 and cold != warm, "warm=False forked from the warm interpreter %r: %r" % (warm, cold))


CASES = [  # (case, methods)
    (case_bad_input, [""]),
    (case_returns, list(METHODS)),
    (case_lambda_fork, ["fork"]),
    (case_main_function, ["spawn", "forkserver"]),
    (case_context, list(METHODS)),
    (case_raises, list(METHODS)),
    (case_exit_code, list(METHODS)),
    (case_signal, list(METHODS)),
    (case_root_cause, list(METHODS)),
    (case_parent_killed, list(METHODS)),
    (case_torchrun_env, list(METHODS)),
    (case_gloo, list(METHODS)),
    (case_warm, ["forkserver", "preload"]),
    (case_hang, ["preload"]),
    (case_parent_env, list(METHODS)),
]


def main(only):
    global HAVE_TORCH
    # `import torch` in a child: this process does not import torch (the cases that need it import it in
    # their processes).
    HAVE_TORCH = subprocess.call([sys.executable, "-c", "import torch"], stderr=subprocess.DEVNULL) == 0
    root = tempfile.mkdtemp(prefix="lspawn-cases-")
    tempfile.tempdir = os.path.join(root, "runs")  # where spawn() makes each run's directory
    os.mkdir(tempfile.tempdir)
    passed = failed = 0
    for case, methods in CASES:
        for method in methods:
            name = case.__name__[5:] + (" " + method if method else "")
            if only and not any(o in name for o in only):
                continue
            d = tempfile.mkdtemp(dir=root)
            started = time.monotonic()
            try:
                case(method, d)
                # spawn()'s run directories live in this process's private directory (lspawn-pyPID-*),
                # kept for the process's life (the warm daemon's socket is there too).
                left = [os.path.join(p, e) for p in os.listdir(tempfile.tempdir) if p.startswith("lspawn-py")
                        for e in os.listdir(os.path.join(tempfile.tempdir, p)) if e.startswith("run-")]
                check(not left, "spawn() left its run directory: %r" % left)
            except Skip as e:
                print("skip %s: %s" % (name, e), flush=True)
                continue
            except Exception:
                print("FAIL %s" % name, flush=True)
                traceback.print_exc()
                failed += 1
            else:
                print("ok %s (%.1f s)" % (name, time.monotonic() - started), flush=True)
                passed += 1
            for entry in os.listdir(tempfile.tempdir):
                if not entry.startswith("lspawn-py"):
                    subprocess.call(["rm", "-rf", os.path.join(tempfile.tempdir, entry)])
    subprocess.call(["rm", "-rf", root])
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
