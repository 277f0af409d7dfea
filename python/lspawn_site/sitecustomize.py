"""lspawn's hang diagnosis for the Python workers it executes (docs/hang-diagnosis.md, "Python workers").

A worker started the plain way (`lspawn python3 train.py`) runs nothing of lspawn, so its collectives would
write no status record and `--hang-timeout` would watch nothing. lspawn therefore starts each Python worker
(argv[0] named python*, without --preload) with this folder first on PYTHONPATH and LSPAWN_PYTHON_SITE set;
Python's `site` imports this module at start-up, which:

1. takes this folder off PYTHONPATH and sys.path and unsets LSPAWN_PYTHON_SITE, so that what the worker
   starts in turn (subprocesses, multiprocessing's spawned children, a DataLoader's workers) runs as it
   would without lspawn;
2. calls lspawn_hang.install() (the file beside this folder's parent): it wraps torch.distributed when the
   script imports it, and answers SIGURG with the main thread's stack; it imports nothing heavy itself; and
   lspawn_hang.no_multiprocessing_leftovers(), so that a worker lspawn kills leaves no semaphore names and
   no pymp-* folder;
3. imports the sitecustomize this one shadows, if the interpreter has one (a distribution's or a venv's),
   as the interpreter would have.

Nothing here may stop the script: a failure is said on stderr and the script runs. Not loaded when Python
ignores PYTHONPATH (-E, -I) or `site` (-S); the launcher's watch then says that the rank wrote no record.
LSPAWN_PYTHON_SITE=0 in lspawn's environment turns the whole thing off.
"""
import os
import sys


def _lspawn_site():
    here = os.path.dirname(os.path.abspath(__file__))
    wanted = os.environ.pop("LSPAWN_PYTHON_SITE", None)

    def ours(entry):
        try:
            return os.path.abspath(entry or os.curdir) == here
        except (TypeError, ValueError):
            return False

    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and not ours(p)]
    if rest:
        os.environ["PYTHONPATH"] = os.pathsep.join(rest)
    else:
        os.environ.pop("PYTHONPATH", None)
    sys.path[:] = [p for p in sys.path if not ours(p)]

    if wanted == "1":
        try:
            hang = sys.modules.get("lspawn_hang")
            if hang is None:
                import importlib.util

                path = os.path.join(os.path.dirname(here), "lspawn_hang.py")
                spec = importlib.util.spec_from_file_location("lspawn_hang", path)
                hang = importlib.util.module_from_spec(spec)
                sys.modules["lspawn_hang"] = hang
                try:
                    spec.loader.exec_module(hang)
                except BaseException:
                    del sys.modules["lspawn_hang"]
                    raise
            hang.install()
        except Exception as e:  # the script runs regardless
            sys.stderr.write("lspawn: the hang diagnosis is off in this worker (%s: %s)\n" % (type(e).__name__, e))
        try:
            hang = sys.modules.get("lspawn_hang")
            if hang is not None:  # a killed worker leaves no semaphore names and no pymp-* folder
                hang.no_multiprocessing_leftovers(os.environ.get("LSPAWN_RUN_DIR"), "mp.%d" % os.getpid())
        except Exception as e:
            sys.stderr.write("lspawn: multiprocessing's leftovers are not taken care of (%s: %s)\n"
                             % (type(e).__name__, e))

    # lspawn --cpu-backend lspawn: the script's gloo groups on lspawn's backend (lspawn/distributed/_override.py).
    if os.environ.get("LSPAWN_CPU_BACKEND") == "lspawn":
        hang = sys.modules.get("lspawn_hang")
        if hang is not None:
            hang.install_cpu_backend(os.path.dirname(here))
        else:
            sys.stderr.write("lspawn: --cpu-backend lspawn is off in this worker (lspawn_hang is not loaded)\n")

    # The sitecustomize this one shadows, if there is one.
    me = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (the next one on sys.path)
    except ImportError as e:
        if getattr(e, "name", None) != "sitecustomize":
            sys.stderr.write("lspawn: this interpreter's sitecustomize failed: %s\n" % e)
        if me is not None:
            sys.modules["sitecustomize"] = me
    except Exception as e:
        sys.stderr.write("lspawn: this interpreter's sitecustomize failed: %s: %s\n" % (type(e).__name__, e))
        if me is not None:
            sys.modules["sitecustomize"] = me


_lspawn_site()
del _lspawn_site
