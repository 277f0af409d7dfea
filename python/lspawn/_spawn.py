"""spawn() and start_processes(): torch.multiprocessing.spawn's contract, run by lspawn.

    import lspawn as mp             # was: import torch.multiprocessing as mp
    mp.spawn(train, args=(cfg,), nprocs=4)

fn(i, *args) runs in `nprocs` processes, i = 0..nprocs-1 (args: any sequence). join=True waits and
returns what fn returned in each process, by index (torch's returns None); join=False returns a
ProcessContext (its return_values once join() returned True). The first failure stops every other process and raises for
its root cause: ProcessRaisedException (fn raised; the child's traceback is in the message) or
ProcessExitedException (exit code, or death by a signal: exit_code -signal, signal_name). Then,
beyond torch's:

- nothing outlives the parent, even a parent killed by SIGKILL: a guardian process kills the
  processes' groups (their own children included) when the parent dies (_guardian.py);
- the root cause is the process that failed first, not whichever join() happened to look at;
- a process that ignores the stop signal is SIGKILLed after `grace_period` seconds (default 30, as torchrun);
- the arguments are checked before any process starts (a function that cannot be pickled is a
  TypeError naming fn, not a failure in every child);
- a script that calls spawn() at top level without the main guard is stopped in every process
  before any grandchild starts, with the fix (_child.py sets _bootstrapping).

Start methods:

- "spawn" (default), "forkserver", or any `preload`: the processes are workers of the native
  `lspawn` launcher (docs/cli.md), which supervises them, prefixes their output with `[rank N] `,
  and with `hang_timeout` watches their collectives (the hang report,
  docs/hang-diagnosis.md; the Python side, lspawn_hang, is installed in each process, and
  wraps torch.distributed once the process imports it). "spawn" without preload: each
  process is a fresh interpreter, as torch's spawn. "forkserver" or preload=[modules]: one
  interpreter started by lspawn imports the modules once (`preload=["torch"]`: `import torch`
  once instead of once per process) and every process is forked from it (`lspawn --preload`).
  With warm=True (the default) that interpreter is kept for the next calls, as multiprocessing
  keeps its forkserver: this process's own `lspawn daemon` holds it (_Daemon), so only the
  first call pays the imports; warm=False starts and ends one per call.
  fn and args are pickled per process with multiprocessing's ForkingPickler (_pickling.py): queues,
  pipes and locks of get_context("spawn") travel, tensors are shared through torch's reductions; a
  fn defined in the parent's `__main__` script works, as with torch's spawn; one of a notebook, a
  lambda or a closure travels by value with cloudpickle (else a TypeError naming the extra).
- "fork": pure Python, no launcher. Each process is an os.fork() of the parent, so fn may be a
  lambda or a closure. It runs in its own process group, with PR_SET_PDEATHSIG (SIGKILL) and
  the guardian. CUDA initialised or Python threads running: refused (_fork.py). No launcher
  watches fork-mode processes: no hang report (hang_timeout is refused), no output prefixes.

torchrun_env=True gives each process torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=a reserved free port, ...), so
torch.distributed.init_process_group() needs no arguments beyond the backend. With the default
False the processes see the parent's values of those variables, as torch's children do
(MASTER_PORT set by the parent, as the tutorials do, reaches them).

`daemon` is accepted for compatibility with torch and has no further effect: the processes
never outlive the parent. At interpreter exit, processes of a context that was never joined are
killed.
"""
import atexit
import collections.abc
import json
import os
import pickle
import re
import signal
import site
import subprocess
import sys
import tempfile
import time

from . import _guardian
from ._worker import RESTORED_KEYS
from ._context import ProcessContext, read_error, remove_dir
from ._errors import exited, raised
from ._paths import lspawn_binary, package_dir

START_METHODS = ("fork", "spawn", "forkserver")
# Popen's arguments for a process group of its own (the guardian kills it by its group id).
_OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
PID_WAIT_S = 60.0  # longest wait for a worker's pid file while the launcher runs
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


BOOTSTRAP_ERROR = """lspawn.spawn() was called while process {index} of a spawn() run was still starting: it
imports the parent's main script ({script}) to find fn there, and that script calls spawn() at top level,
so every process would start processes of its own. Put the call under the main guard:

    if __name__ == "__main__":
        lspawn.spawn(fn, args=..., nprocs=...)

(torch.multiprocessing and multiprocessing need the same guard; start_method="fork" does not re-run the script.)"""

# Set by lspawn._child while it prepares `__main__` (runs the parent's script as __mp_main__).
_bootstrapping = None


def _check_not_bootstrapping():
    if _bootstrapping is not None:
        index, script = _bootstrapping
        raise RuntimeError(BOOTSTRAP_ERROR.format(index=index, script=script or "__main__"))


def _as_args(args):
    """args as a tuple: torch documents a tuple, Lightning passes a list; any sequence but a string is taken."""
    if isinstance(args, tuple):
        return args
    if isinstance(args, (str, bytes, bytearray)) or not isinstance(args, collections.abc.Sequence):
        raise TypeError("lspawn.spawn: args must be a tuple or another sequence (fn(i, *args)), got %s"
                        % type(args).__name__)
    return tuple(args)


def _check(fn, args, nprocs, start_method, preload, grace_period, hang_timeout, daemon_socket):
    """Validates the arguments before anything starts."""
    _check_not_bootstrapping()
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError("lspawn.spawn: nprocs must be an int >= 1, got %r" % (nprocs,))
    if start_method not in START_METHODS:
        raise ValueError("lspawn.spawn: unknown start_method %r: use one of %s"
                         % (start_method, ", ".join(START_METHODS)))
    if not callable(fn):
        raise TypeError("lspawn.spawn: fn must be callable, got %r" % (fn,))
    if preload is not None:
        if not isinstance(preload, (list, tuple)) or not all(isinstance(m, str) for m in preload):
            raise TypeError("lspawn.spawn: preload must be a list of module names, e.g. ['torch'], got %r" % (preload,))
        for m in preload:
            if not _MODULE_NAME.match(m):
                raise ValueError("lspawn.spawn: preload: %r is not a module name" % (m,))
        if start_method == "fork":
            raise ValueError("lspawn.spawn: preload does not apply to start_method='fork' (a forked process has "
                             "the parent's modules already); use 'forkserver' or 'spawn'")
    _check_grace(grace_period)
    if hang_timeout is not None:
        if not _is_number(hang_timeout) or hang_timeout <= 0:
            raise ValueError("lspawn.spawn: hang_timeout must be a number of seconds > 0, got %r" % (hang_timeout,))
        if start_method == "fork":
            raise ValueError("lspawn.spawn: hang_timeout needs lspawn's launcher, which start_method='fork' does "
                             "not use; use 'spawn' or 'forkserver'")
    if daemon_socket is not None:
        if daemon_socket is not True and not (isinstance(daemon_socket, str) and daemon_socket):
            raise TypeError("lspawn.spawn: daemon_socket must be a path or True (the default socket of "
                            "`lspawn daemon`), got %r" % (daemon_socket,))
        if start_method == "fork":
            raise ValueError("lspawn.spawn: daemon_socket does not apply to start_method='fork'; use "
                             "'forkserver' or preload=[...]")


def _check_grace(grace_period):
    if grace_period is not None and (not _is_number(grace_period) or grace_period < 0):
        raise ValueError("lspawn.spawn: grace_period must be a number of seconds >= 0, got %r" % (grace_period,))


def _seconds(x):
    return repr(float(x))


def _launcher_env():
    env = dict(os.environ)
    # An installed package holds the launcher's helpers (the wheel's layout): the launcher takes them
    # from there and from nowhere else. A source checkout (python/lspawn/, the tests' PYTHONPATH)
    # holds none: the launcher then finds its build tree's own (supervisor/install_layout.hpp).
    if os.path.isfile(os.path.join(package_dir(), "lspawn_preload.py")):
        env["LSPAWN_HOME"] = package_dir()
    # The workers run `python -m lspawn._child`: make this lspawn importable there when a fresh
    # interpreter would not find it (a source tree, a sys.path set by the program). The child
    # gives PYTHONPATH the parent's value back.
    parent = os.path.dirname(package_dir())
    known = [*getattr(site, "getsitepackages", list)(), site.getusersitepackages(),
             *env.get("PYTHONPATH", "").split(os.pathsep)]
    if not any(p and os.path.realpath(p) == os.path.realpath(parent) for p in known):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (parent, env.get("PYTHONPATH")) if p)
    return env


class _Daemon:
    """This process's own `lspawn daemon` (warm=True): it keeps the preload interpreter between calls.

    Started at the first warm call, on a socket in a private directory, in a process group of its own
    registered with the guardian (it dies with this process, even a SIGKILLed one; its forkservers and
    their workers follow it: PR_SET_PDEATHSIG on each link, docs/warm-start.md); stopped at exit.
    The first call pays the imports once (the daemon's forkserver does them); later calls with the same
    interpreter, modules and environment fork from it (docs/python.md)."""

    def __init__(self, binary, env):
        self.dir = tempfile.mkdtemp(prefix="daemon-", dir=_guardian.private_dir())  # starts the guardian
        self.socket = os.path.join(self.dir, "daemon.sock")
        # Its log (listening, forkservers started, stopped at exit) goes to a file, not the user's console: what
        # a run must know (a forkserver refused) reaches that run's launcher, which prints it.
        self.log = os.path.join(self.dir, "daemon.log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([binary, "daemon", "--socket", self.socket], env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, **_OWN_GROUP)
        try:
            _guardian.register(self.proc.pid)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        deadline = time.monotonic() + 10
        while not os.path.exists(self.socket):  # the client goes cold when the socket is not there yet
            if self.proc.poll() is not None or time.monotonic() > deadline:
                try:
                    with open(self.log, errors="replace") as f:
                        said = f.read().strip()[-2000:]
                except OSError:
                    said = ""
                self.stop()
                raise RuntimeError("lspawn.spawn: its lspawn daemon did not start (exit code %s%s); use warm=False"
                                   % (self.proc.returncode, ": " + said if said else ""))
            time.sleep(0.005)
        self.owner = os.getpid()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        _guardian.unregister(self.proc.pid)
        remove_dir(self.dir)


_daemon = None


def _warm_socket(binary, env):
    global _daemon
    if _daemon is None or _daemon.owner != os.getpid() or _daemon.proc.poll() is not None:
        _daemon = _Daemon(binary, env)
    return _daemon.socket


@atexit.register
def _stop_daemon():
    global _daemon
    d, _daemon = _daemon, None
    if d is not None and d.owner == os.getpid():
        d.stop()


def _start_launcher(fn, args, nprocs, start_method, preload, torchrun_env, grace_period, hang_timeout, warm,
                    daemon_socket):
    import multiprocessing.spawn
    from ._pickling import dumps_for_ranks
    fn_bytes, args_bytes, sharing = dumps_for_ranks(fn, args, nprocs, start_method)
    binary = lspawn_binary()
    directory = tempfile.mkdtemp(prefix="run-", dir=_guardian.private_dir())  # starts the guardian
    try:
        prep = multiprocessing.spawn.get_preparation_data("lspawn-spawn")
        prep["authkey"] = bytes(prep["authkey"])  # an AuthenticationString refuses plain pickling
        if not os.path.isfile(prep.get("init_main_from_path") or "/"):
            prep.pop("init_main_from_path", None)  # `python -` ("<stdin>"): nothing a process can run again
        payload = {
            "fn": fn_bytes,  # both one per rank: the resource sharer hands each fd out once
            "args": args_bytes,
            "prep": prep,
            "parent_env": {k: os.environ.get(k) for k in RESTORED_KEYS},
            "torchrun_env": bool(torchrun_env),
            "hang_diagnosis": True,  # cheap: lspawn_hang wraps torch.distributed only once it is imported
        }
        with open(os.path.join(directory, "payload"), "wb") as f:
            pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
        cmd = [binary, "--nprocs", str(nprocs), "--result-file", os.path.join(directory, "result.json"), "--quiet",
               "--no-summary"]
        if grace_period is not None:
            cmd += ["--grace-period", _seconds(grace_period)]
        if hang_timeout is not None:
            cmd += ["--hang-timeout", _seconds(hang_timeout)]
        env = _launcher_env()
        if preload or start_method == "forkserver":
            # lspawn too: each process then finds the package imported (not ~30 ms of imports per process).
            modules = list(preload or [])
            cmd += ["--preload", ",".join(modules + (["lspawn"] if "lspawn" not in modules else []))]
            if daemon_socket is True:
                cmd += ["--warm"]
            elif daemon_socket is not None:
                cmd += ["--warm", "--daemon-socket", daemon_socket]
            elif warm:
                cmd += ["--warm", "--daemon-socket", _warm_socket(binary, env)]
        cmd += ["--", sys.executable, "-m", "lspawn._child", directory]
        sys.stdout.flush()
        sys.stderr.flush()
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, **_OWN_GROUP)
    except BaseException:
        sharing.forget()
        remove_dir(directory)
        raise
    _guardian.register(proc.pid)
    return _LauncherContext(proc, directory, nprocs, sharing)


class _LauncherContext(ProcessContext):
    """The workers of one `lspawn` launcher run; the launcher is in its own process group."""

    def __init__(self, proc, directory, nprocs, sharing):
        self._proc = proc
        self._dir = directory
        self._pids = [None] * nprocs
        self._status = None  # after the launcher exited: [(exit code, signal)] by index, from its result
        self._finished = False
        self._error = None
        self._sharing = sharing

    def _read_pid(self, i):
        try:
            with open(os.path.join(self._dir, "pid.%d" % i)) as f:
                self._pids[i] = int(f.read())
        except (OSError, ValueError):
            pass
        return self._pids[i]

    def pids(self):
        deadline = time.monotonic() + PID_WAIT_S
        for i in range(len(self._pids)):
            while self._pids[i] is None and not self._finished and self._read_pid(i) is None:
                if self._proc.poll() is not None:
                    self._finish()
                elif time.monotonic() > deadline:
                    raise RuntimeError("lspawn.spawn: process %d has not started within %g s" % (i, PID_WAIT_S))
                else:
                    time.sleep(0.01)
            if self._pids[i] is None:
                raise RuntimeError("lspawn.spawn: process %d never started (lspawn exited with code %d)"
                                   % (i, self._proc.returncode))
        return list(self._pids)

    def _exit_status(self, index):
        if self._status is None and self._proc.poll() is not None:
            self._finish()
        return None if self._status is None else self._status[index]

    def join(self, timeout=None, grace_period=None):
        """torch 2.x's join. The launcher stops the others itself at the first failure (SIGTERM at once,
        SIGKILL after spawn()'s grace_period); join's grace_period is checked and has no further effect here."""
        _check_grace(grace_period)
        if not self._finished:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            except KeyboardInterrupt:
                self._interrupt()
                raise
            self._finish()
        if self._error is not None:
            raise self._error
        return True

    def _interrupt(self):
        """Ctrl-C in the parent: the launcher (its own process group, so the terminal's SIGINT
        does not reach it) gets SIGINT, stops the workers and is waited for; a second Ctrl-C
        makes it SIGKILL them at once."""
        while True:
            try:
                self._proc.send_signal(signal.SIGINT)
                self._proc.wait()
                break
            except KeyboardInterrupt:
                continue
        self._finish()

    def _finish(self):
        """After the launcher exited: reads its result, settles the error, removes the directory."""
        if self._finished:
            return
        self._finished = True
        self._proc.wait()
        _guardian.unregister(self._proc.pid)
        self._sharing.forget()
        for i in range(len(self._pids)):
            if self._pids[i] is None:
                self._read_pid(i)
        try:
            self._error = self._outcome()
            if self._error is None:
                self._read_values(self._dir, len(self._pids))
        except RuntimeError as e:
            self._error = e
        finally:
            remove_dir(self._dir)

    def _outcome(self):
        code = self._proc.returncode
        try:
            with open(os.path.join(self._dir, "result.json")) as f:
                result = json.load(f)
        except (OSError, ValueError):
            return RuntimeError("lspawn exited with code %d before reporting (see its output above)" % code)
        # proto::RunResult: one column per field, indexed by local rank; root_cause -1 when none.
        n = len(result.get("pids", []))
        col = lambda name: (result.get(name) or [0] * n)  # noqa: E731
        pids, exit_codes, signals, stopped = col("pids"), col("exit_codes"), col("signals"), col("stopped")
        if n == len(self._pids):
            self._status = list(zip(exit_codes, signals))
        if code == 0:
            return None
        root = result.get("root_cause", -1)
        if not 0 <= root < n:
            failed = [i for i in range(n) if (exit_codes[i] or signals[i]) and not stopped[i]]
            root = failed[0] if failed else None
        if root is None:
            why = "its hang watchdog stopped the processes (the hang report is above)" if result.get("hang") else \
                "no process failed by itself (see its output above)"
            return RuntimeError("lspawn exited with code %d: %s" % (code, why))
        pid = pids[root] or self._pids[root]
        report = read_error(self._dir, root)
        if report is not None:
            return raised(root, pid, report[1])
        return exited(root, pid, exit_codes[root], signals[root])


def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn", *,
                    preload=None, torchrun_env=False, grace_period=None, hang_timeout=None, warm=True,
                    daemon_socket=None):
    """Runs fn(i, *args) for i in range(nprocs) in separate processes (see the module's doc).

    join=True: waits, raises for the root cause of a failure, and returns the list of what fn
    returned in each process (by index; torch's returns None). join=False: the ProcessContext."""
    args = _as_args(args)
    _check(fn, args, nprocs, start_method, preload, grace_period, hang_timeout, daemon_socket)
    if start_method == "fork":
        from ._fork import start_fork
        context = start_fork(fn, args, nprocs, torchrun_env, 30.0 if grace_period is None else float(grace_period))
    else:
        context = _start_launcher(fn, args, nprocs, start_method, preload, torchrun_env, grace_period,
                                  hang_timeout, warm, daemon_socket)
    if not join:
        return context
    while not context.join():
        pass
    return context.return_values


def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn", *,
          preload=None, torchrun_env=False, grace_period=None, hang_timeout=None, warm=True, daemon_socket=None):
    """torch.multiprocessing.spawn with lspawn's guarantees (see the module's doc)."""
    return start_processes(fn, args, nprocs, join, daemon, start_method, preload=preload,
                           torchrun_env=torchrun_env, grace_period=grace_period, hang_timeout=hang_timeout,
                           warm=warm, daemon_socket=daemon_socket)
