"""The worker side of lspawn.spawn(): `python -m lspawn._child DIR`, one per rank, started by lspawn.

DIR is the run's private directory (written by the parent, _spawn.py): DIR/payload holds the
pickled function, its arguments, multiprocessing's preparation data of the parent (its sys.path,
working directory and `__main__`, so a function defined in the parent's script is found, as
torch.multiprocessing's spawn finds it) and the parent's values of the torchrun variables. A worker:

1. writes its pid to DIR/pid.<LOCAL_RANK> (ProcessContext.pids());
2. installs the Python hang diagnosis (lspawn_hang) when the launcher watches (LSPAWN_STATUS_DIR):
   its record and stack thread at once, the wrappers of torch.distributed's collectives when the
   process imports it (install() does not import torch itself);
3. unless spawn(torchrun_env=True), gives the variables of torchrun's contract (RANK, WORLD_SIZE,
   MASTER_ADDR, MASTER_PORT, ...) the parent's values back, unsetting those the parent did not
   have, as torch.multiprocessing's children see them; TORCHELASTIC_ERROR_FILE and LSPAWN_* stay;
4. prepares `__main__` as multiprocessing does (a top-level spawn() of an unguarded script is refused
   there, before any grandchild starts) and unpickles the function and its own copy of the
   arguments (shared objects are fetched from the parent then, _pickling.py); a failure there, e.g.
   fn's module does not import, is reported as an exception of fn would be;
5. calls fn(LOCAL_RANK, *args) through _worker.run(), which keeps its return value, reports an
   exception (DIR/error.<rank> for the parent, $TORCHELASTIC_ERROR_FILE for the launcher's summary)
   and makes the worker exit 1. SystemExit and KeyboardInterrupt propagate as in any script.

A worker that is killed leaves nothing of multiprocessing's behind (_worker.multiprocessing_leftovers).

The package's __init__ does not import this module: `-m` runs it fresh as __main__.
"""
import os
import pickle
import sys

from lspawn._worker import hang_module, multiprocessing_leftovers, report, run, write_atomic


def _install_hang_diagnosis():
    try:
        hang_module().install()
    except Exception as e:
        print("lspawn: hang diagnosis is off in this worker: %s" % e, file=sys.stderr, flush=True)


def _prepare(payload, index):
    """multiprocessing's preparation (sys.path, cwd, the parent's `__main__` run again as __mp_main__),
    then (fn, args) unpickled. Meanwhile, as in multiprocessing's spawned children, the process is
    `_inheriting`: a multiprocessing Process started by the script is refused, a manager's proxy is
    not counted twice; and a top-level spawn() in the script is refused (_spawn._bootstrapping)."""
    prep = payload["prep"]
    import multiprocessing.process
    import multiprocessing.spawn
    from lspawn import _spawn
    me = multiprocessing.process.current_process()
    _spawn._bootstrapping = (index, prep.get("init_main_from_path") or prep.get("init_main_from_name"))
    me._inheriting = True
    try:
        multiprocessing.spawn.prepare(prep)
        return pickle.loads(payload["fn"][index]), pickle.loads(payload["args"][index])
    finally:
        del me._inheriting
        _spawn._bootstrapping = None


def main(argv):
    if len(argv) != 1:
        print("usage: python -m lspawn._child DIR (run by lspawn.spawn() only)", file=sys.stderr)
        return 2
    directory = argv[0]
    index = int(os.environ["LOCAL_RANK"])
    write_atomic(os.path.join(directory, "pid.%d" % index), str(os.getpid()))
    with open(os.path.join(directory, "payload"), "rb") as f:
        payload = pickle.load(f)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if payload["hang_diagnosis"] and os.environ.get("LSPAWN_STATUS_DIR"):
        _install_hang_diagnosis()  # before anything starts a thread; it reads RANK: not restored yet
    multiprocessing_leftovers(directory, index)
    for key, value in payload["parent_env"].items():
        if payload["torchrun_env"] and key != "PYTHONPATH":
            continue
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        fn, args = _prepare(payload, index)
    except Exception:
        report(directory, index, error_file)  # fn's module failed to import, say: the parent raises it
        return 1
    return run(fn, index, args, directory, error_file)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
