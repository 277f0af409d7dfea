"""torch.multiprocessing's exceptions (torch/multiprocessing/spawn.py), same constructors and fields.

`error_pid` is torch's name for the failed process's pid (1.13 called it `pid`); both are set. The
messages are torch's: "process 1 terminated with exit code 3", "process 1 terminated with signal
SIGSEGV", and "\\n\\n-- Process 1 terminated with the following error:\\n" + the child's traceback.

When the parent has imported torch, what spawn() raises is also an instance of torch's class of the
same name (a subclass of both, made once per class: _as_torch), so `except
torch.multiprocessing.ProcessRaisedException` in accelerate, Lightning or user code catches it as
it catches torch's own. `import lspawn` never imports torch for it.
"""
import signal
import sys


class ProcessException(Exception):
    def __init__(self, msg, error_index, pid):
        Exception.__init__(self, msg)  # not super(): in a class that is also torch's, the next is torch's
        self.msg = msg
        self.error_index = error_index
        self.pid = pid
        self.error_pid = pid

    _pickled_as = None  # lspawn's own class, for the class made by _as_torch (which no module names)

    def __reduce__(self):
        return self._pickled_as or type(self), (self.msg, self.error_index, self.pid)


class ProcessRaisedException(ProcessException):
    """A process failed with an exception raised by its function."""

    def __init__(self, msg, error_index, error_pid):
        ProcessException.__init__(self, msg, error_index, error_pid)


class ProcessExitedException(ProcessException):
    """A process exited with a non-zero code, or died of a signal (exit_code is then -signal)."""

    def __init__(self, msg, error_index, error_pid, exit_code, signal_name=None):
        ProcessException.__init__(self, msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self):
        return self._pickled_as or type(self), (self.msg, self.error_index, self.pid, self.exit_code,
                                                 self.signal_name)


_torch_classes = {}


def _as_torch(cls):
    """cls, or once torch is imported, a class that is both cls and torch.multiprocessing's class of its name."""
    if "torch" not in sys.modules:
        return cls
    try:
        import torch.multiprocessing as tmp
        theirs = getattr(tmp, cls.__name__)
    except (ImportError, AttributeError):
        return cls
    if not isinstance(theirs, type) or issubclass(cls, theirs):
        return cls
    both = _torch_classes.get(cls)
    if both is None:
        both = type(cls.__name__, (cls, theirs), {"__module__": cls.__module__, "__doc__": cls.__doc__,
                                                   "__reduce__": cls.__reduce__, "_pickled_as": cls})
        _torch_classes[cls] = both
    return both


def raised(index, pid, trace):
    msg = "\n\n-- Process %d terminated with the following error:\n" % index + trace
    return _as_torch(ProcessRaisedException)(msg, index, pid)


def exited(index, pid, exit_code, signum):
    """exit_code when signum is 0, else death by signal `signum` (exit_code -signum, as torch's)."""
    if signum:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = "signal %d" % signum
        return _as_torch(ProcessExitedException)("process %d terminated with signal %s" % (index, name),
                                                 error_index=index, error_pid=pid, exit_code=-signum,
                                                 signal_name=name)
    return _as_torch(ProcessExitedException)("process %d terminated with exit code %d" % (index, exit_code),
                                             error_index=index, error_pid=pid, exit_code=exit_code)
