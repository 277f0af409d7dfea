"""ProcessContext: what spawn(join=False) returns; the files a run's processes leave in its directory."""
import json
import os
import pickle
import select
import shutil
import signal


class ProcessContext:
    """The processes of one spawn() call (torch.multiprocessing.ProcessContext's contract).

    join(timeout=None, grace_period=None) waits for them: True once every process ended
    successfully, False when `timeout` seconds passed with some still running; when one fails,
    the others are stopped (the stop signal, SIGKILL after the grace period) and the root cause is
    raised as ProcessRaisedException (it raised an exception) or ProcessExitedException (an exit
    code or a signal). A later join() raises the same exception again. pids() lists the
    processes' pids by index; `processes` the same as objects with multiprocessing.Process's
    face (pid, exitcode, sentinel, is_alive(), join(), terminate(), kill()), and `sentinels`
    maps each one's sentinel to its index, as torch's do. `return_values`: what fn returned in
    each process, by index, once join() returned True.
    """

    _processes = None
    _values = None

    def join(self, timeout=None, grace_period=None):
        raise NotImplementedError

    def pids(self):
        raise NotImplementedError

    def _exit_status(self, index):
        """(exit code, signal) of process `index` once known, else None."""
        raise NotImplementedError

    @property
    def processes(self):
        if self._processes is None:
            self._processes = [RankProcess(self, i, pid) for i, pid in enumerate(self.pids())]
        return self._processes

    @property
    def sentinels(self):
        return {p.sentinel: i for i, p in enumerate(self.processes) if p.sentinel is not None}

    @property
    def return_values(self):
        """What fn returned in process 0, 1, ... (None for a process whose fn returned None)."""
        if self._values is None:
            raise RuntimeError("lspawn: return_values: the processes have not all ended successfully (join() "
                               "returns True once they have)")
        return list(self._values)

    def _read_values(self, directory, nprocs):
        """After success: each process's value from DIR/return.<i>; an unreadable one is an error naming it."""
        values = []
        for i in range(nprocs):
            try:
                with open(os.path.join(directory, "return.%d" % i), "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                values.append(None)
                continue
            try:
                values.append(pickle.loads(data))
            except Exception as e:
                raise RuntimeError("lspawn: the value process %d returned cannot be unpickled here: %s: %s"
                                   % (i, type(e).__name__, e)) from e
        self._values = values


class RankProcess:
    """One process of a spawn() run with multiprocessing.Process's face, for code that reads
    ProcessContext.processes (Lightning's launcher does): pid, exitcode (None while it runs or
    until the run's outcome is known), sentinel (a pidfd: readable once it ended; None where the
    kernel has none), is_alive(), join(timeout), terminate(), kill(). Signals go through the pidfd,
    so never to a process that reused the pid."""

    daemon = False

    def __init__(self, context, index, pid):
        self._context = context
        self.index = index
        self.pid = pid
        self.name = "lspawn-process-%d" % index
        self._fd = pidfd_open(pid)

    @property
    def sentinel(self):
        return self._fd

    @property
    def ident(self):
        return self.pid

    @property
    def exitcode(self):
        status = self._context._exit_status(self.index)
        if status is None:
            return None
        code, sig = status
        return -sig if sig else code

    def _ended(self, timeout=0):
        if self._context._exit_status(self.index) is not None:
            return True
        if self._fd is not None:
            return bool(select.select([self._fd], [], [], timeout)[0])
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False

    def is_alive(self):
        return not self._ended()

    def join(self, timeout=None):
        self._ended(timeout)

    def _signal(self, sig):
        if self._ended():
            return
        try:
            if self._fd is not None:
                pidfd_send_signal(self._fd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self):
        self._signal(signal.SIGTERM)

    def kill(self):
        self._signal(signal.SIGKILL)

    def __del__(self):
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def __repr__(self):
        code = self.exitcode
        state = "started" if code is None else "stopped exitcode=%d" % code
        return "<RankProcess %s pid=%d %s>" % (self.name, self.pid, state)


# pidfd_open(2) and pidfd_send_signal(2) (Linux 5.3, 5.1): os/signal have them from Python 3.9; for 3.8,
# the system calls by number (the same on every Linux architecture: the generic table's).
_SYS_PIDFD_OPEN, _SYS_PIDFD_SEND_SIGNAL = 434, 424
_libc = None


def _syscall(*args):
    global _libc
    import ctypes
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    r = _libc.syscall(*[ctypes.c_long(a) for a in args])
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def pidfd_open(pid):
    """A pidfd of pid (close-on-exec), or None where the kernel has none."""
    try:
        if hasattr(os, "pidfd_open"):
            return os.pidfd_open(pid)
        fd = _syscall(_SYS_PIDFD_OPEN, pid, 0)
        os.set_inheritable(fd, False)
        return fd
    except OSError:
        return None


def pidfd_send_signal(fd, sig):
    if hasattr(signal, "pidfd_send_signal"):
        signal.pidfd_send_signal(fd, sig)
    else:
        try:
            _syscall(_SYS_PIDFD_SEND_SIGNAL, fd, int(sig), 0, 0)
        except OSError as e:
            if e.errno == 3:  # ESRCH
                raise ProcessLookupError(e.errno, e.strerror) from None
            raise


def read_error(directory, index):
    """(time, traceback text) that process `index` wrote when its function raised, or None."""
    try:
        with open(os.path.join(directory, "error.%d" % index)) as f:
            report = json.load(f)
        return float(report["time"]), str(report["traceback"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_dir(directory):
    shutil.rmtree(directory, ignore_errors=True)
