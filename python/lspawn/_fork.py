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
from ._worker import run
from ._context import ProcessContext, read_error, remove_dir
from ._errors import exited, raised

_PR_SET_PDEATHSIG = 1


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun_env(i, nprocs, port):
    env = {"RANK": i, "LOCAL_RANK": i, "ROLE_RANK": i, "WORLD_SIZE": nprocs, "LOCAL_WORLD_SIZE": nprocs,
           "ROLE_WORLD_SIZE": nprocs, "GROUP_RANK": 0, "GROUP_WORLD_SIZE": 1,
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    return {k: str(v) for k, v in env.items()}


def _child(fn, index, args, directory, parent, env):
    """The forked child: never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
        os.environ.update(env)
        code = run(fn, index, args, directory)
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


def start_fork(fn, args, nprocs, torchrun_env, grace_period):
    directory = tempfile.mkdtemp(prefix="run-", dir=_guardian.private_dir())  # starts the guardian
    context = None
    try:
        port = _free_port() if torchrun_env else None
        parent = os.getpid()
        context = _ForkContext(directory, grace_period)
        for i in range(nprocs):
            env = _torchrun_env(i, nprocs, port) if torchrun_env else {}
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(fn, i, args, directory, parent, env)
            try:
                os.setpgid(pid, pid)
            except (PermissionError, ProcessLookupError):
                pass  # the child did it first (and may have exited already)
            _guardian.register(pid)
            context._add(pid)
    except BaseException:
        if context is not None:
            context._stop(signal.SIGKILL, 0)
        remove_dir(directory)
        raise
    return context


class _ForkContext(ProcessContext):
    def __init__(self, directory, grace_period):
        self._dir = directory
        self._grace = grace_period
        self._pids = []
        self._pidfds = []
        self._ends = []        # None while running, else (exit_code, signal, time seen)
        self._stopped = set()  # indices the parent sent a stop signal to
        self._stop_time = None  # when it sent the first
        self._finished = False
        self._error = None

    def _add(self, pid):
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = None
        self._pids.append(pid)
        self._pidfds.append(fd)
        self._ends.append(None)

    def pids(self):
        return list(self._pids)

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
            code = os.waitstatus_to_exitcode(status)
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
        remove_dir(self._dir)

    def join(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._finished:
                self._reap()
                if any(end is not None and end[:2] != (0, 0) for end in self._ends):
                    self._stop(signal.SIGTERM, self._grace)
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
