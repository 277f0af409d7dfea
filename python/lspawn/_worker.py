"""What a process of spawn() runs around fn, in every start method: the call and its error report.

run(fn, i, args, DIR, error_file) calls fn(i, *args). An exception prints its traceback on
stderr, is written to DIR/error.<i> (JSON: the time it was caught and the traceback, read by the
parent for its exception and its choice of the root cause) and, given an error_file (the
launcher's $TORCHELASTIC_ERROR_FILE), there in torchrun's format
({"message": {"message": "ValueError: ...", "extraInfo": {"py_callstack": ..., "timestamp": ...}}}),
which the launcher's root-cause summary reads; run() then returns 1. SystemExit and
KeyboardInterrupt propagate.
"""
import json
import os
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


def write_atomic(path, text):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def report(directory, index, error_file=None):
    """Prints the exception being handled, writes it to DIR/error.<index> and torchrun's error file."""
    now = time.time()
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


def run(fn, index, args, directory, error_file=None):
    """Calls fn(index, *args); on an exception reports it (see above) and returns 1, else 0."""
    try:
        fn(index, *args)
    except Exception:
        report(directory, index, error_file)
        return 1
    return 0
