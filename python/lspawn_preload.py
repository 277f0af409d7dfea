"""lspawn's Python preload server: `lspawn --preload torch[,MODULE...] --nprocs N python3 train.py [ARGS]`.

lspawn executes this file once per node (never run it yourself: it needs the fds lspawn hands it), as

    python3 lspawn_preload.py --lib liblspawn_preload.so --modules torch,lightning

It imports the modules (torch: ~3 s), checks that forking is safe, and becomes lspawn's fork loop
(spawn/python_preload_entry.hpp, fork_loop.hpp: the C++ forkserver's own loop, in a shared
library loaded with ctypes.PyDLL so the GIL stays held). Each worker returns from that loop, takes
the run's script and sys.argv from LSPAWN_PRELOAD_ARGV (a JSON array, set per run by lspawn, so a
warm server of `lspawn daemon` serves any script), and runs it as `__main__` as `python3 SCRIPT
ARGS` (or `python3 -m MODULE ARGS`) would: the same environment (lspawn's torchrun contract:
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_ERROR_FILE, ...), sys.argv, sys.path[0],
stdio, exit codes (SystemExit, a traceback and 1 for an uncaught exception, death by SIGINT for
an uncaught KeyboardInterrupt), atexit handlers.

Refused, with the module's name, before any worker is forked (lspawn prints the reason, exits 1):
- a module that does not import (the exception's type and text, and where it was raised);
- a module whose import started a thread (counted in /proc/self/task, so threads of C
  extensions too, and by threading): a fork copies only the forking thread, and a lock
  another thread held stays locked forever in the child. Threads that their library stops
  before a fork itself (pthread_atfork: OpenBLAS's pool, started by numpy and Debian's torch at
  import unless OMP_NUM_THREADS=1) are accepted: when /proc/self/task counts more than one,
  it is counted again after one fork() of a child that exits at once; jemalloc's background
  threads ("jemalloc_bg_thd", fork-safe by jemalloc's own handlers) are accepted by name. The
  refusal names the threads (threading's names, else /proc's). LSPAWN_PRELOAD_ALLOW_THREADS=1 forks anyway, with
  a warning naming them (SpawnOptions::allow_fork_with_threads for C++ programs);
- a module whose import initialised CUDA (torch.cuda.is_initialized()): a CUDA context does not
  survive fork(). torch initialises CUDA lazily, on the first CUDA call, never at import; this
  check catches a module that makes one at import time. Checked before the threads (a CUDA
  context starts the driver's threads too); LSPAWN_PRELOAD_ALLOW_THREADS does not lift it.

What differs from exec mode (docs/cli.md): the modules are imported once, in the server, with the
environment common to every worker (not RANK etc.), and with sys.path as `python3 -c` has it
without a script directory (PYTHONPATH, site-packages): a module beside the script only is not
found (import it in the script instead). The workers share the server's hash seed (PYTHONHASHSEED)
and torch's default generator state as seeded at import (the same seed exec mode gets); Python's
`random` and numpy's global generator are reseeded per worker, as in separate interpreters.
At exit a worker runs threading's shutdown, the atexit handlers and flushes stdio, then _exits
without tearing the modules down (LibTorch's static destructors: ~0.2 s of CPU per process),
as multiprocessing's forked children do; LSPAWN_FORKSERVER_FAST_EXIT=0 keeps the interpreter's full
finalisation. Each worker also runs lspawn_hang.install() (the Python hang diagnosis) before the
script.
"""
import os
import sys

ARGV_ENV = "LSPAWN_PRELOAD_ARGV"
FDS_ENV = "LSPAWN_FORKSERVER_FDS"
FAST_EXIT_ENV = "LSPAWN_FORKSERVER_FAST_EXIT"
ALLOW_THREADS_ENV = "LSPAWN_PRELOAD_ALLOW_THREADS"
_HERE = os.path.abspath(__file__)


def _usage(why):
    print("lspawn_preload.py: %s\nusage (run by lspawn --preload only): python3 lspawn_preload.py "
          "--lib LIBRARY --modules M1[,M2...]" % why, file=sys.stderr)
    sys.exit(2)


def _parse(argv):
    opts = {}
    i = 0
    while i < len(argv):
        if argv[i] in ("--lib", "--modules") and i + 1 < len(argv):
            opts[argv[i]] = argv[i + 1]
            i += 2
        else:
            _usage("unexpected argument %r" % argv[i])
    if "--lib" not in opts or "--modules" not in opts:
        _usage("--lib and --modules are required")
    modules = opts["--modules"].split(",")
    if any(not m for m in modules):
        _usage("an empty module name in --modules %r" % opts["--modules"])
    return opts["--lib"], modules


class _Library:
    """liblspawn_preload.so (python_preload_entry.hpp)."""

    def __init__(self, path):
        import ctypes
        self.ctypes = ctypes
        self.lib = ctypes.PyDLL(path)  # PyDLL: the GIL is held during each call (the fork needs it)
        self.lib.lspawn_preload_threads.restype = ctypes.c_int
        self.lib.lspawn_preload_threads.argtypes = []
        self.lib.lspawn_preload_threads_after_fork.restype = ctypes.c_int
        self.lib.lspawn_preload_threads_after_fork.argtypes = []
        self.lib.lspawn_preload_refuse.restype = ctypes.c_int
        self.lib.lspawn_preload_refuse.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        self.lib.lspawn_preload_serve.restype = ctypes.c_int
        self.lib.lspawn_preload_serve.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_char_p, ctypes.c_size_t]
        self.err = ctypes.create_string_buffer(4096)

    def threads(self):
        """Threads of this process, and when more than one, of it after one fork() (python_preload_entry.hpp):
        threads a library stops in its own fork handler (OpenBLAS's pool) are safe."""
        n = self.lib.lspawn_preload_threads()
        if n > 1:
            n = self.lib.lspawn_preload_threads_after_fork()
        return n

    def refuse(self, why):
        """Tells lspawn why no worker can be forked; exits."""
        _flush()
        if self.lib.lspawn_preload_refuse(os.fsencode(why), self.err, len(self.err)) != 0:
            print("lspawn_preload.py: %s (%s)" % (why, os.fsdecode(self.err.value)), file=sys.stderr, flush=True)
        os._exit(1)

    def serve(self):
        """Serves lspawn's fork requests; returns in each worker."""
        c = self.ctypes
        api = c.pythonapi
        hooks = [c.cast(getattr(api, f), c.c_void_p) for f in
                 ("PyOS_BeforeFork", "PyOS_AfterFork_Parent", "PyOS_AfterFork_Child")]
        if self.lib.lspawn_preload_serve(*hooks, self.err, len(self.err)) != 0:
            print("lspawn_preload.py: %s" % os.fsdecode(self.err.value), file=sys.stderr, flush=True)
            os._exit(1)


def _flush():
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass


def _raised_where(exc):
    tb = exc.__traceback__
    last = None
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not name.startswith("<frozen") and os.sep + "importlib" + os.sep not in name:  # importlib's own frames
            last = tb
        tb = tb.tb_next
    if last is None or last.tb_frame.f_code.co_filename == _HERE:
        return ""
    return " (raised at %s:%d)" % (last.tb_frame.f_code.co_filename, last.tb_lineno)


def _python_threads():
    threading = sys.modules.get("threading")
    if threading is None:
        return []
    main = threading.main_thread()
    return [t.name for t in threading.enumerate() if t is not main]


def _native_thread_names():
    """The names (/proc/self/task/TID/comm) of this process's threads but the main one: what a C
    extension or driver named its threads (the CUDA driver's, say), else the interpreter's name."""
    names = []
    me = str(os.getpid())
    try:
        tids = sorted(os.listdir("/proc/self/task"), key=int)
    except OSError:
        return names
    for tid in tids:
        if tid == me:
            continue
        try:
            with open("/proc/self/task/%s/comm" % tid) as f:
                names.append(f.read().strip() or "?")
        except OSError:
            pass  # it ended meanwhile
    return names


# Threads that their library keeps safe across fork() itself, by their name in /proc: jemalloc's
# background threads ("jemalloc_bg_thd": its pthread_atfork handlers hold its locks across the
# fork and the child starts without them). Seen on a GPU machine: importing Lightning loads a
# library that starts one.
_FORK_SAFE_THREADS = ("jemalloc_bg_thd",)


def _allow_threads(lib):
    """LSPAWN_PRELOAD_ALLOW_THREADS=1: fork although an import started threads (a warning instead of
    the refusal), as SpawnOptions::allow_fork_with_threads does for C++ programs."""
    v = os.environ.get(ALLOW_THREADS_ENV, "")
    if v in ("", "0"):
        return False
    if v == "1":
        return True
    lib.refuse("%s=%r: expected 1 (fork anyway) or 0" % (ALLOW_THREADS_ENV, v))


def _preload(lib, modules):
    import importlib
    allow_threads = _allow_threads(lib)  # a bad value is refused before anything is imported
    for m in modules:
        try:
            importlib.import_module(m)
        except BaseException as e:  # SystemExit and KeyboardInterrupt of an import too
            text = str(e)
            lib.refuse("cannot import '%s': %s%s%s" % (m, type(e).__name__, ": " + text if text else "",
                                                        _raised_where(e)))
        _flush()
        # CUDA first: initialising it starts the driver's threads too, and this is the reason to say.
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None) if torch is not None else None
        if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
            lib.refuse("importing '%s' initialised CUDA (torch.cuda.is_initialized()); a CUDA context does not "
                       "survive fork(): import it in the script instead of --preload" % m)
        names = _python_threads()
        threads = 1 if names else lib.threads()
        if threads > 1 and not names and all(t in _FORK_SAFE_THREADS for t in _native_thread_names()):
            threads = 1  # only threads their own library makes fork-safe
        if threads != 1 or names:
            n = max(threads - 1, len(names))
            what = ("threading: " + ", ".join(names) if names
                    else "not Python threads: " + (", ".join(_native_thread_names()) or "gone since"))
            why = "importing '%s' started %d thread%s (%s)" % (m, n, "" if n == 1 else "s", what)
            if allow_threads:
                print("lspawn: --preload: %s; forking workers anyway (%s=1): a lock one of them held stays "
                      "locked in every worker" % (why, ALLOW_THREADS_ENV), file=sys.stderr, flush=True)
            else:
                lib.refuse("%s; forking workers from it is unsafe: import it in the script instead of --preload "
                           "(or set %s=1 to fork anyway)" % (why, ALLOW_THREADS_ENV))


def _refresh_environ():
    """os.environ is a snapshot taken at start-up: make it the environment the fork loop installed."""
    import ctypes
    env = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.pythonapi, "environ")
    now = {}
    i = 0
    while env[i] is not None:
        k, sep, v = env[i].partition(b"=")
        if sep and k:
            now[os.fsdecode(k)] = os.fsdecode(v)
        i += 1
    for k in list(os.environ):
        if k not in now:
            del os.environ[k]
    for k, v in now.items():
        if os.environ.get(k) != v:
            os.environ[k] = v


def _worker_setup():
    """In a worker, just forked: what a fresh interpreter would have, and its own run's state."""
    import signal
    _refresh_environ()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as CPython does at start-up (the loop reset it)
    if not getattr(sys.stdout, "write_through", True) and hasattr(sys.stdout, "reconfigure"):  # not -u
        sys.stdout.reconfigure(line_buffering=os.isatty(1))  # fd 1 is the worker's pipe now, not the server's
    nprandom = sys.modules.get("numpy.random")
    if nprandom is not None and hasattr(nprandom, "seed"):
        nprandom.seed()  # fresh entropy, as a separate interpreter gets
    import json
    try:
        argv = json.loads(os.environ.pop(ARGV_ENV))
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("not a non-empty list of strings")
    except (KeyError, ValueError) as e:
        print("lspawn_preload.py: worker %d: no script to run (%s=%r: %s)" % (
            os.getpid(), ARGV_ENV, os.environ.get(ARGV_ENV), e), file=sys.stderr, flush=True)
        os._exit(2)
    try:
        import lspawn_hang
        lspawn_hang.install()
    except Exception as e:
        print("lspawn: hang diagnosis is off in this worker: %s" % e, file=sys.stderr, flush=True)
    try:
        # A killed worker leaves no semaphore names and no pymp-* folder.
        lspawn_hang.no_multiprocessing_leftovers(os.environ.get("LSPAWN_RUN_DIR"), "mp.%d" % os.getpid())
    except Exception as e:
        print("lspawn: multiprocessing's leftovers are not taken care of: %s" % e, file=sys.stderr, flush=True)
    try:  # lspawn --cpu-backend lspawn
        lspawn_hang.install_cpu_backend(os.path.dirname(os.path.abspath(__file__)))
    except NameError:  # lspawn_hang did not import (said above)
        pass
    return argv


def _is_runner_frame(tb):
    name = tb.tb_frame.f_code.co_filename
    return name == _HERE or name == "<frozen runpy>" or name.endswith(os.sep + "runpy.py")


def _print_uncaught(exc):
    tb = exc.__traceback__
    while tb is not None and _is_runner_frame(tb):
        tb = tb.tb_next
    exc.__traceback__ = tb  # the default hook prints the exception's own traceback
    sys.excepthook(type(exc), exc, tb)


def _run(argv):
    """Runs the script (or -m module) as __main__; returns the exit code (None: died by SIGINT)."""
    import runpy
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]  # run_module(alter_sys=True) sets sys.argv[0] to the module's file
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            if not os.path.exists(script):
                print("%s: can't open file %r: [Errno 2] No such file or directory" % (
                    sys.orig_argv[0] if hasattr(sys, "orig_argv") else sys.executable, os.path.abspath(script)),
                    file=sys.stderr)
                return 2
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
            runpy.run_path(os.path.abspath(script), run_name="__main__")  # __file__ absolute, as since 3.9
        return 0
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        try:
            print(code, file=sys.stderr)
        except Exception:
            pass
        return 1
    except KeyboardInterrupt as e:
        _print_uncaught(e)
        return None
    except BaseException as e:
        _print_uncaught(e)
        return 1


def _exit(code):
    """Leaves as the interpreter would: non-daemon threads joined, atexit handlers, stdio flushed."""
    if os.environ.get(FAST_EXIT_ENV) == "0":
        if code is None:
            raise KeyboardInterrupt
        sys.exit(code)
    import threading
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except BaseException:
            pass
    import atexit
    atexit._run_exitfuncs()
    _flush()
    if code is None:  # an uncaught KeyboardInterrupt: die by SIGINT, as CPython >= 3.8
        import signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 128 + signal.SIGINT
    os._exit(code & 0xFF)


def main(argv):
    if FDS_ENV not in os.environ:
        _usage("%s is not set: this server is started by lspawn --preload only" % FDS_ENV)
    lib_path, modules = _parse(argv)
    try:
        lib = _Library(lib_path)
    except OSError as e:
        print("lspawn_preload.py: cannot load %s: %s" % (lib_path, e), file=sys.stderr, flush=True)
        os._exit(1)
    # The hang diagnosis (this directory) is imported now; then sys.path is a script-less
    # interpreter's: the script's directory comes per worker.
    try:
        import lspawn_hang  # noqa: F401
    except Exception:
        pass
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(_HERE):
        del sys.path[0]
    _preload(lib, modules)
    import gc
    gc.collect()
    gc.freeze()  # the preloaded objects: never scanned in the workers, so their pages stay shared
    _flush()
    lib.serve()
    # A worker from here on (the frozen objects stay frozen: collecting them would copy their pages).
    _exit(_run(_worker_setup()))


if __name__ == "__main__":
    main(sys.argv[1:])
