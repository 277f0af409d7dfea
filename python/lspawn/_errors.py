"""torch.multiprocessing's exceptions (torch/multiprocessing/spawn.py), same constructors and fields.

`pid` is torch's name for the failed process's pid; `error_pid` is the same value. The messages
are torch's: "process 1 terminated with exit code 3", "process 1 terminated with signal SIGSEGV",
and "\\n\\n-- Process 1 terminated with the following error:\\n" + the child's traceback.
"""
import signal


class ProcessException(Exception):
    def __init__(self, msg, error_index, pid):
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.pid = pid
        self.error_pid = pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid)


class ProcessRaisedException(ProcessException):
    """A process failed with an exception raised by its function."""

    def __init__(self, msg, error_index, error_pid):
        super().__init__(msg, error_index, error_pid)


class ProcessExitedException(ProcessException):
    """A process exited with a non-zero code, or died of a signal (exit_code is then -signal)."""

    def __init__(self, msg, error_index, error_pid, exit_code, signal_name=None):
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid, self.exit_code, self.signal_name)


def raised(index, pid, trace):
    msg = "\n\n-- Process %d terminated with the following error:\n" % index + trace
    return ProcessRaisedException(msg, index, pid)


def exited(index, pid, exit_code, signum):
    """exit_code when signum is 0, else death by signal `signum` (exit_code -signum, as torch's)."""
    if signum:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = "signal %d" % signum
        return ProcessExitedException("process %d terminated with signal %s" % (index, name),
                                      error_index=index, error_pid=pid, exit_code=-signum, signal_name=name)
    return ProcessExitedException("process %d terminated with exit code %d" % (index, exit_code),
                                  error_index=index, error_pid=pid, exit_code=exit_code)
