"""lspawn: torchrun's launcher and torch.multiprocessing.spawn, with a supervisor that names the root cause.

From Python:

    import lspawn as mp              # was: import torch.multiprocessing as mp
    mp.spawn(train, args=(cfg,), nprocs=4)
    mp.spawn(train, args=(cfg,), nprocs=4, preload=["torch"])   # import torch once, fork the ranks

spawn() / start_processes() keep torch.multiprocessing's contract (fn(i, *args), join, the
ProcessContext and the exceptions) and add lspawn's guarantees: nothing outlives the parent, even
a SIGKILLed one; the first failure is the one reported; the stop signal escalates to SIGKILL;
bad arguments fail before anything starts (lspawn/_spawn.py has the details).

From the shell, `python -m lspawn [options] program [args...]` runs the native launcher of this
install, the same as the `lspawn` command (docs/cli.md).
"""
try:
    from ._version import __version__
except ImportError:
    __version__ = "0+unknown"

from ._context import ProcessContext
from ._errors import ProcessException, ProcessExitedException, ProcessRaisedException
from ._spawn import spawn, start_processes

__all__ = ["spawn", "start_processes", "ProcessContext", "ProcessException", "ProcessRaisedException",
           "ProcessExitedException", "__version__"]
