"""What a process of spawn() runs around fn, in every start method: the call, its value, its error report.

run(fn, i, args, DIR, error_file) calls fn(i, *args). A value other than None is pickled to
DIR/return.<i> for the parent (ProcessContext.return_values); one that cannot be pickled is a
TypeError of this process, naming it. An exception is written to DIR/error.<i> (JSON: the time it
was caught and the traceback, read by the parent for its exception and its choice of the root
cause) and, given an error_file (the launcher's $TORCHELASTIC_ERROR_FILE), there in torchrun's
format ({"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack": ..., "timestamp":
...}}}); run() then returns 1. The traceback is not printed here: the parent's exception carries
it, as torch's spawn does (printing it too made it appear two or three times). SystemExit and
KeyboardInterrupt propagate.
"""
import json
import os
import pickle
import sys
import time
import traceback

# torchrun's variables (supervisor/env_contract.hpp) that a torch.multiprocessing child would not
# have had unless its parent had them. PYTHONPATH: lspawn may add its own folder for the child.
TORCHRUN_KEYS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS",
)
RESTORED_KEYS = TORCHRUN_KEYS + ("PYTHONPATH",)


def write_atomic(path, data):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def report(directory, index, error_file=None, echo=False):
    """Writes the exception being handled to DIR/error.<index> and torchrun's error file (and stderr if echo)."""
    now = time.time()
    if echo:
        traceback.print_exc()
        sys.stderr.flush()
    text = traceback.format_exc()
    exc = sys.exc_info()[1]
    try:
        write_atomic(os.path.join(directory, "error.%d" % index), json.dumps({"time": now, "traceback": text}))
    except OSError as e:
        print("lspawn: process %d: cannot write its error for the parent: %s" % (index, e), file=sys.stderr)
    if error_file:
        torchrun = {"message": {"message": "%s: %s" % (type(exc).__name__, exc),
                                "extraInfo": {"py_callstack": text, "timestamp": str(int(now))}}}
        try:
            write_atomic(error_file, json.dumps(torchrun))
        except OSError as e:
            print("lspawn: process %d: cannot write %s: %s" % (index, error_file, e), file=sys.stderr)


def hang_module():
    """lspawn_hang: the preload server's copy when it imported one, else the wheel's (lspawn.lspawn_hang), else
    a source checkout's (python/lspawn_hang.py, beside the package)."""
    hang = sys.modules.get("lspawn_hang")
    if hang is None:
        try:
            from lspawn import lspawn_hang as hang
        except ImportError:
            import lspawn_hang as hang
    return hang


def multiprocessing_leftovers(directory, index):
    """A killed worker of spawn() leaves nothing of multiprocessing's: no semaphore names, and its temporary
    folder in DIR (DIR/mp.<index>), which the parent, or the guardian if the parent dies, removes
    (lspawn_hang.no_multiprocessing_leftovers). Never a failure of the worker: said, and multiprocessing's
    defaults stay."""
    try:
        hang_module().no_multiprocessing_leftovers(directory, "mp.%d" % index)
    except Exception as e:
        print("lspawn: process %d: multiprocessing's leftovers are not taken care of: %s" % (index, e),
              file=sys.stderr, flush=True)


def _keep_value(directory, index, value):
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise TypeError("lspawn.spawn: process %d returned a value that cannot be pickled for the parent (%s): "
                        "%s: %s" % (index, type(value).__name__, type(e).__name__, e)) from e
    write_atomic(os.path.join(directory, "return.%d" % index), data)


def run(fn, index, args, directory, error_file=None):
    """Calls fn(index, *args), keeps its value; on an exception reports it (see above) and returns 1, else 0."""
    try:
        value = fn(index, *args)
        if value is not None:
            _keep_value(directory, index, value)
    except Exception:
        report(directory, index, error_file)
        return 1
    return 0
