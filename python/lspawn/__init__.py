"""lspawn: torchrun's launcher and torch.multiprocessing.spawn, with a supervisor that names the root cause.

From Python:

    import lspawn as mp              # was: import torch.multiprocessing as mp
    mp.spawn(train, args=(cfg,), nprocs=4)
    mp.spawn(train, args=(cfg,), nprocs=4, preload=["torch"])   # import torch once, fork the ranks

spawn() / start_processes() keep torch.multiprocessing's contract (fn(i, *args), join, the
ProcessContext and the exceptions) and add lspawn's guarantees: nothing outlives the parent, even
a SIGKILLed one; the first failure is the one reported; the stop signal escalates to SIGKILL;
bad arguments fail before anything starts (lspawn/_spawn.py has the details). join=True returns
what fn returned in each process, by index.

The rest of torch.multiprocessing's face is here too, resolved at first use (_face.py):
get_context, Queue, SimpleQueue, Pipe, Process, Manager, set_sharing_strategy, ... from
torch.multiprocessing when torch is importable, else from multiprocessing; queues, locks and
tensors passed in args are shared in every start method (_pickling.py). lspawn.install() makes
torch.multiprocessing.spawn / start_processes lspawn's, for code that calls torch's.

From the shell, `python -m lspawn [options] program [args...]` runs the native launcher of this
install, the same as the `lspawn` command (docs/cli.md).
"""
try:
    from ._version import __version__
except ImportError:
    __version__ = "0+unknown"

from ._context import ProcessContext
from ._errors import ProcessException, ProcessExitedException, ProcessRaisedException
from ._face import NAMES as _REEXPORTS, install, installed, uninstall
from ._spawn import spawn, start_processes

SpawnContext = ProcessContext  # torch's name before 1.4, still exported by torch.multiprocessing

__all__ = ["spawn", "start_processes", "ProcessContext", "SpawnContext", "ProcessException", "ProcessRaisedException",
           "ProcessExitedException", "install", "uninstall", "installed", "__version__", *_REEXPORTS]


def __getattr__(name):
    """torch.multiprocessing's re-exports (multiprocessing's names and the sharing strategy), at first use."""
    if name in _REEXPORTS:
        from ._face import resolve
        value = resolve(name)
        globals()[name] = value
        return value
    raise AttributeError("module 'lspawn' has no attribute %r" % (name,))


def __dir__():
    return sorted(set(globals()) | set(_REEXPORTS))
