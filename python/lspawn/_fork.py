"""spawn(start_method="fork"): the processes are os.fork()s of the parent, supervised in Python.

Each child puts itself in its own process group, asks for SIGKILL when the parent dies
(PR_SET_PDEATHSIG; it exits at once if the parent is already gone), runs fn(i, *args) with the
same error reporting as the launcher's workers (_child.run), flushes stdio and leaves with
os._exit (never returning into the parent's code, no atexit handlers: as multiprocessing's forked
children). The parent registers each group with the guardian (_guardian.py).

join() watches the children (pidfds; a short poll without them). At the first failure every other
child's group gets SIGTERM, and SIGKILL after the grace period. The root cause is the failure
that happened first: for a child whose fn raised, the time it wrote with its traceback; for the
others, when the parent saw its exit. A child that the parent stopped is never the root cause
(unless fn had raised before the stop). When a child ends, whatever is left of its process group
is SIGKILLed (before the child is reaped, so the group id cannot have been reused).

Checked before any fork (fork() copies only the calling thread: whatever lock another thread
held stays locked in the child):
- CUDA initialised in this process (torch.cuda.is_initialized()): refused, a CUDA context does
  not survive fork();
- Python threads besides the main one (by name; multiprocessing's own resource sharer excepted,
  which re-arms itself in a child): refused; LSPAWN_PRELOAD_ALLOW_THREADS=1, the preload server's
  knob, forks anyway with a warning;
- threads of C libraries that are still there after one trial fork (OpenBLAS stops its pool in a
  fork handler: it passes): a warning, once per process, naming them. Not a refusal: torch's GNU
  OpenMP intra-op pool is one after any CPU op, and torch's fork start method (and its own tests
  of it) forks with it; but measured here with torch 2.15, a forked child's first parallel op
  after the parent used that pool hangs for ever, so the warning says so.

torchrun_env=True: MASTER_PORT is reserved, not probed: a socket bound to it with SO_REUSEADDR,
never listening, is held by the context until the run ends (supervisor/port.hpp's way), so no
other bind(0) gets the port, while rank 0's TCPStore (SO_REUSEADDR) can listen on it.

join(timeout, grace_period) has torch 2.x's meaning: after a failure the others get grace_period
to end by themselves, then the stop signal (SIGTERM), then SIGKILL after grace_period (or
spawn()'s grace_period when join gives none: SIGTERM at once, as before torch 2.3).

Not here, as no launcher watches these children: the hang report, `[rank N] ` output prefixes,
the launcher's failure summary. PR_SET_PDEATHSIG fires when the *thread* that forked exits: call
spawn(start_method="fork", join=False) from a thread that outlives the children.
"""
import ctypes
import os
import select
import signal
import socket
import sys
import tempfile
import time
import traceback

from . import _guardian
from ._worker import multiprocessing_leftovers, run
from ._context import ProcessContext, pidfd_open, read_error, remove_dir
from ._errors import exited, raised

_PR_SET_PDEATHSIG = 1


ALLOW_THREADS_ENV = "LSPAWN_PRELOAD_ALLOW_THREADS"
# Threads their library keeps safe across fork() (lspawn_preload.py has the same list).
_FORK_SAFE_THREADS = ("jemalloc_bg_thd",)


def reserve_port(addr="127.0.0.1"):
    """A socket that holds a free port of addr without listening (see the module's doc); caller closes it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, 0))
    except BaseException:
        s.close()
        raise
    return s


def _exit_code(status):
    """os.waitstatus_to_exitcode (Python 3.9) for 3.8 too."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _python_threads():
    import threading
    try:
        from multiprocessing import resource_sharer
        sharer = resource_sharer._resource_sharer._thread
    except (ImportError, AttributeError):
        sharer = None
    main = threading.main_thread()
    return [t.name for t in threading.enumerate() if t is not main and t is not sharer]


def _native_threads():
    """The names (/proc's comm) of this process's other threads, counted again after one trial fork
    when there are some (a library that stops its pool in a fork handler restarts it lazily)."""
    def names():
        me = str(os.getpid())
        found = []
        for tid in os.listdir("/proc/self/task"):
            if tid != me:
                try:
                    with open("/proc/self/task/%s/comm" % tid) as f:
                        found.append(f.read().strip() or "?")
                except OSError:
                    pass
        return [n for n in found if n not in _FORK_SAFE_THREADS]
    if not names():
        return []
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: "multi-threaded, use of fork()": what we test
        pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return names()


def fork_hazards():
    """What makes forking this process now unsafe: [(kind, why)], kind "cuda", "threads" or "native"."""
    found = []
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        found.append(("cuda", "CUDA is initialised in this process (torch.cuda.is_initialized()), and a CUDA "
                              "context does not survive fork(): use start_method='spawn' (or preload=['torch']), "
                              "or start the processes before the first CUDA call"))
    names = _python_threads()
    if names:
        found.append(("threads", "other threads run in this process (threading: %s), and fork() copies only the "
                                 "calling thread: a lock one of them holds stays locked in every child: use "
                                 "start_method='spawn' (or preload=[...]), stop them first, or set %s=1 to fork "
                                 "anyway" % (", ".join(names), ALLOW_THREADS_ENV)))
    elif not found:
        native = _native_threads()
        if native:
            found.append(("native", "threads of a C library run in this process (%s; torch's intra-op pool is one, "
                                    "after a CPU op): a child's first parallel op may hang on a pool that fork() did "
                                    "not copy; use start_method='spawn' or preload=[...] if one does"
                                    % ", ".join(native)))
    return found


_warned_native = False


def _check_fork():
    """Refuses CUDA and Python threads (the latter liftable); warns once about a C library's threads,
    which torch's own fork start method and its tests fork with."""
    global _warned_native
    allow = os.environ.get(ALLOW_THREADS_ENV, "")
    if allow not in ("", "0", "1"):
        raise ValueError("lspawn.spawn: %s=%r: expected 1 (fork anyway) or 0" % (ALLOW_THREADS_ENV, allow))
    for kind, why in fork_hazards():
        if kind == "native":
            if not _warned_native:
                _warned_native = True
                print("lspawn.spawn: start_method='fork': warning: " + why, file=sys.stderr, flush=True)
        elif kind == "threads" and allow == "1":
            print("lspawn.spawn: start_method='fork': forking with other threads running (%s=1): %s"
                  % (ALLOW_THREADS_ENV, why.split("(", 1)[1].split(")", 1)[0]), file=sys.stderr, flush=True)
        else:
            raise RuntimeError("lspawn.spawn: start_method='fork' refused: " + why)


def _torchrun_env(i, nprocs, port):
    env = {"RANK": i, "LOCAL_RANK": i, "ROLE_RANK": i, "WORLD_SIZE": nprocs, "LOCAL_WORLD_SIZE": nprocs,
           "ROLE_WORLD_SIZE": nprocs, "GROUP_RANK": 0, "GROUP_WORLD_SIZE": 1,
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    return {k: str(v) for k, v in env.items()}


def _as_multiprocessing_child():
    """What multiprocessing's Process does first in a forked child (process.py, _bootstrap): no finalizer
    or child of the parent's, and its at-fork hooks run (a Queue's feeder state, the resource sharer)."""
    from multiprocessing import process, util
    process._children = set()
    util._finalizer_registry.clear()
    util._run_after_forkers()


def _multiprocessing_exit():
    """What it does last: the finalizers (a Queue's feeder thread flushes what fn put), which os._exit
    would skip."""
    from multiprocessing import util
    try:
        util._exit_function()
    except Exception:
        traceback.print_exc()


def _child(fn, index, args, directory, parent, env, port):
    """The forked child: never returns."""
    code = 1
    try:
        if port is not None:
            port.close()  # the parent's reservation: rank 0's store binds the port
        os.setpgid(0, 0)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
        os.environ.update(env)
        _as_multiprocessing_child()
        multiprocessing_leftovers(directory, index)
        try:
            code = run(fn, index, args, directory)
        finally:
            _multiprocessing_exit()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if code == -signal.SIGINT:  # an uncaught KeyboardInterrupt: death by SIGINT, as python's
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF)


def _share_tensors(args):
    """Moves the CPU tensors in args (nested in lists, tuples, sets and dicts; an nn.Module's parameters
    and buffers) to shared memory before the fork, as spawn's pickling does: the parent then sees what
    the processes write (torch's fork start method leaves them copy-on-write: the writes are lost)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    module = getattr(getattr(torch, "nn", None), "Module", ())
    seen = set()

    def walk(x, depth):
        if depth > 16 or id(x) in seen:
            return
        seen.add(id(x))
        try:
            if isinstance(x, torch.Tensor):
                if x.device.type == "cpu" and not x.is_shared():
                    x.share_memory_()
            elif isinstance(x, module):
                x.share_memory()
            elif isinstance(x, (list, tuple, set, frozenset)):
                for v in x:
                    walk(v, depth + 1)
            elif isinstance(x, dict):
                for v in x.values():
                    walk(v, depth + 1)
        except RuntimeError:
            pass  # a tensor that cannot be shared (sparse, a view of a graph): copied on write, as before
    walk(args, 0)


def start_fork(fn, args, nprocs, torchrun_env, grace_period):
    _check_fork()
    _share_tensors(args)
    directory = tempfile.mkdtemp(prefix="run-", dir=_guardian.private_dir())  # starts the guardian
    context = None
    port = None
    try:
        port = reserve_port() if torchrun_env else None
        parent = os.getpid()
        context = _ForkContext(directory, grace_period, port)
        for i in range(nprocs):
            env = _torchrun_env(i, nprocs, port.getsockname()[1]) if torchrun_env else {}
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(fn, i, args, directory, parent, env, port)
            try:
                os.setpgid(pid, pid)
            except (PermissionError, ProcessLookupError):
                pass  # the child did it first (and may have exited already)
            _guardian.register(pid)
            context._add(pid)
    except BaseException:
        if context is not None:
            context._stop(signal.SIGKILL, 0)
        if port is not None:
            port.close()
        remove_dir(directory)
        raise
    return context


class _ForkContext(ProcessContext):
    def __init__(self, directory, grace_period, port):
        self._dir = directory
        self._grace = grace_period
        self._port = port
        self._pids = []
        self._pidfds = []
        self._ends = []        # None while running, else (exit_code, signal, time seen)
        self._stopped = set()  # indices the parent sent a stop signal to
        self._stop_time = None  # when it sent the first
        self._finished = False
        self._error = None

    def _add(self, pid):
        fd = pidfd_open(pid)
        self._pids.append(pid)
        self._pidfds.append(fd)
        self._ends.append(None)

    def pids(self):
        return list(self._pids)

    def _exit_status(self, index):
        self._reap()
        end = self._ends[index]
        return None if end is None else end[:2]

    def _running(self):
        return [i for i, end in enumerate(self._ends) if end is None]

    def _reap(self):
        """Records every child that ended, after SIGKILLing what is left of its group."""
        for i in self._running():
            pid = self._pids[i]
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                continue
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            _, status = os.waitpid(pid, 0)
            code = _exit_code(status)
            self._ends[i] = (max(code, 0), max(-code, 0), time.time())
            _guardian.unregister(pid)
            if self._pidfds[i] is not None:
                os.close(self._pidfds[i])
                self._pidfds[i] = None

    def _wait(self, timeout):
        """Sleeps until a child may have ended, or `timeout` seconds (None: no limit)."""
        fds = [self._pidfds[i] for i in self._running()]
        if fds and all(fd is not None for fd in fds):
            select.select(fds, [], [], timeout)
        else:
            time.sleep(0.02 if timeout is None else max(0.0, min(timeout, 0.02)))

    def _stop(self, signum, grace):
        """Sends `signum` to every running child's group; SIGKILL after `grace` seconds; reaps all."""
        if self._stop_time is None:
            self._stop_time = time.time()
        for sig, wait in ((signum, grace), (signal.SIGKILL, None)):
            for i in self._running():
                self._stopped.add(i)
                try:
                    os.killpg(self._pids[i], sig)
                except OSError:
                    pass
            deadline = None if wait is None else time.monotonic() + wait
            while True:
                self._reap()
                if not self._running():
                    return
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._wait(left)

    def _root_cause(self):
        candidates = []
        for i, (code, sig, seen) in enumerate(self._ends):
            if code == 0 and sig == 0:
                continue
            report = read_error(self._dir, i)
            if i in self._stopped and (report is None or report[0] >= self._stop_time):
                continue  # stopped by the parent, not failed by itself before that
            candidates.append((report[0] if report else seen, i, report))
        if not candidates:
            return None
        _, i, report = min(candidates)
        if report is not None:
            return raised(i, self._pids[i], report[1])
        code, sig, _ = self._ends[i]
        return exited(i, self._pids[i], code, sig)

    def _finish(self, error):
        self._finished = True
        self._error = error
        if self._port is not None:
            self._port.close()
        try:
            if error is None:
                self._read_values(self._dir, len(self._pids))
        except RuntimeError as e:
            self._error = e
        remove_dir(self._dir)

    def _let_end(self, seconds):
        """Waits up to `seconds` for the running children to end by themselves."""
        deadline = time.monotonic() + seconds
        while True:
            self._reap()
            left = deadline - time.monotonic()
            if not self._running() or left <= 0:
                return
            self._wait(left)

    def join(self, timeout=None, grace_period=None):
        if grace_period is not None and (isinstance(grace_period, bool) or not isinstance(grace_period, (int, float))
                                         or grace_period < 0):
            raise ValueError("lspawn: join: grace_period must be a number of seconds >= 0, got %r" % (grace_period,))
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._finished:
                self._reap()
                if any(end is not None and end[:2] != (0, 0) for end in self._ends):
                    if grace_period is not None:
                        self._let_end(grace_period)
                    self._stop(signal.SIGTERM, self._grace if grace_period is None else grace_period)
                    self._finish(self._root_cause())
                elif not self._running():
                    self._finish(None)
                else:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._wait(left)
        except KeyboardInterrupt:
            # Ctrl-C in the parent: the children (their own groups) did not get the terminal's
            # SIGINT; they get it now, SIGKILL after the grace period (at once on a second Ctrl-C).
            try:
                self._stop(signal.SIGINT, self._grace)
            except KeyboardInterrupt:
                self._stop(signal.SIGKILL, 0)
            self._finish(None)
            raise
        if self._error is not None:
            raise self._error
        return True
