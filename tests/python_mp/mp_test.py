"""`import lspawn as mp` as torch.multiprocessing (docs/python.md, "A drop-in for torch.multiprocessing").

Run by ctest with the Python of the line under test (and, without torch, with every other Python
3.8+ found: tests/python_mp/pythons.sh), lspawn importable (PYTHONPATH=<repo>/python, LSPAWN_BIN,
LSPAWN_GUARDIAN): `python mp_test.py [-v] [TestClass[.test]]`.

1. TorchContract*: torch.multiprocessing's own spawn tests (pytorch test/test_multiprocessing_spawn.py:
   success, join thrice, a SimpleQueue of get_context() in args, one exception, all raise, a
   signal, an exit code, success then an exception, nested spawns killed with their parent, the
   exception classes, pickling them), restated here, in every start method lspawn has: spawn,
   forkserver, fork, and preload.
2. Beyond them, per start method: return values (and one that cannot be pickled), args as a
   list, a Queue, a Pipe, an Event, a Lock and a Value in args, a Manager's proxies, CPU tensors
   shared (the parent sees the workers' writes), ProcessContext.processes / sentinels / join(timeout).
3. Once: the bootstrapping guard (an unguarded script stops before any grandchild starts, with the
   fix), a notebook's `__main__` function and a lambda (cloudpickle; without it a TypeError naming the
   extra), fork's refusals (a Python thread, CUDA), torch's exception classes, the re-exports,
   install() / uninstall(), join(grace_period) in fork mode, a running `lspawn daemon` reached with
   daemon_socket=.
"""
import importlib.util
import multiprocessing.connection
import multiprocessing.process
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

import lspawn as mp

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_CLOUDPICKLE = importlib.util.find_spec("cloudpickle") is not None
METHODS = {
    "spawn": dict(start_method="spawn"),
    "forkserver": dict(start_method="forkserver"),
    "fork": dict(start_method="fork"),
    # preload=["torch"] where torch is (the call users make), else a module every Python has.
    "preload": dict(start_method="spawn", preload=["torch" if HAVE_TORCH else "json"]),
}
CONTEXT = {"spawn": "spawn", "forkserver": "forkserver", "fork": "fork", "preload": "spawn"}


# -- what the processes run (module level: a new interpreter finds them by reference) --------------

def success(i):
    pass


def put_index(i, queue):
    if queue:
        queue.put(i)


def raise_if(i, which):
    if i == which:
        raise ValueError("legitimate exception from process %d" % i)
    time.sleep(1.0)


def raise_all(i):
    time.sleep(0.01 * i)
    raise ValueError("legitimate exception from process %d" % i)


def abort_0(i):
    if i == 0:
        os.kill(os.getpid(), signal.SIGABRT)
    time.sleep(1.0)


def exit_0(i, code):
    if i == 0:
        sys.exit(code)
    time.sleep(1.0)


def success_then_raise(i, arg):  # torch's test calls it with args=() too: a TypeError, raised
    if i == 0:
        return
    time.sleep(0.1)
    raise ValueError("legitimate exception")


def sleep_forever(i, ready=None):
    if ready is not None:
        ready.put(i)
    while True:
        time.sleep(1)


def nested_body(i, ready, seconds):
    ready.put(None)
    time.sleep(seconds)


def nested(i, pids_queue, seconds, kwargs):
    import multiprocessing.util
    ready = mp.get_context(CONTEXT_OF[kwargs.get("start_method")]).Queue()
    context = mp.start_processes(nested_body, args=(ready, seconds), nprocs=2, join=False, **kwargs)
    # What multiprocessing leaves of this process once it is killed: its Queue's semaphores' names in
    # /dev/shm, its temporary folder (the resource sharer's socket, when it shared an fd with the children).
    names = [lock._semlock.name for lock in (ready._rlock, ready._wlock, ready._sem) if lock is not None]
    pids_queue.put((context.pids(), names, multiprocessing.util.get_temp_dir()))
    pids_queue.close()
    pids_queue.join_thread()  # flushed before the SIGTERM below (torch's own version of this test races here)
    for _ in range(2):
        ready.get()
    os.kill(os.getpid(), signal.SIGTERM)  # the children must die with this process


CONTEXT_OF = {"spawn": "spawn", "forkserver": "forkserver", "fork": "fork"}


def square(i, base):
    return {"rank": i, "value": (base + i) ** 2, "pid": os.getpid()}


def return_unpicklable(i):
    if i == 1:
        return threading.Lock()
    return i


def echo_args(i, *args):
    return args


def use_shared(i, queue, conn, event, lock, counter):
    queue.put(("queue", i))
    if i == 0:
        conn.send("pipe from 0")
        event.set()
    with lock:
        counter.value += 1


def use_proxies(i, d, items):
    d[i] = i * 10
    items.append(i)


def write_tensor(i, t):
    t[i] = i + 1


def lspawn_env(i):
    return sorted(k for k in os.environ if k.startswith("LSPAWN_"))


def exit_with(i, codes):
    time.sleep(0.05 * i)
    sys.exit(codes[i])


def record_term(i, path, linger):
    """Records whether it got SIGTERM; lingers `linger` seconds after it."""
    def on_term(*_):
        with open("%s.%d" % (path, i), "w") as f:
            f.write("term")
        time.sleep(linger)
        os._exit(7)
    signal.signal(signal.SIGTERM, on_term)
    if i == 0:
        sys.exit(3)
    time.sleep(30)


# -- 1. torch's own tests, restated, in each start method ---------------------------------------------

class _Contract:
    method = None

    def start(self, fn, **kw):
        kw.update(METHODS[self.method])
        return mp.start_processes(fn, **kw)

    def test_success(self):
        self.start(success, nprocs=2)

    def test_success_non_blocking(self):
        context = self.start(success, nprocs=2, join=False)
        context.join(timeout=None)
        context.join(timeout=None)
        self.assertTrue(context.join(timeout=None))

    def test_first_argument_index(self):
        queue = mp.get_context(CONTEXT[self.method]).SimpleQueue()
        self.start(put_index, args=(queue,), nprocs=2)
        self.assertEqual([0, 1], sorted([queue.get(), queue.get()]))

    def test_exception_single(self):
        for i in range(2):
            with self.assertRaisesRegex(Exception, "\nValueError: legitimate exception from process %d$" % i):
                self.start(raise_if, args=(i,), nprocs=2)

    def test_exception_all(self):
        with self.assertRaisesRegex(Exception, "\nValueError: legitimate exception from process (0|1)$"):
            self.start(raise_all, nprocs=2)

    def test_terminate_signal(self):
        with self.assertRaisesRegex(Exception, "process 0 terminated with signal (SIGABRT|SIGIOT)"):
            self.start(abort_0, nprocs=2)

    def test_terminate_exit(self):
        with self.assertRaisesRegex(Exception, "process 0 terminated with exit code 123"):
            self.start(exit_0, args=(123,), nprocs=2)

    def test_success_first_then_exception(self):
        with self.assertRaisesRegex(Exception, "ValueError: legitimate exception"):
            self.start(success_then_raise, args=(123,), nprocs=2)

    def test_nested(self):
        pids_queue = mp.get_context(CONTEXT[self.method]).Queue()
        kwargs = {"start_method": METHODS[self.method]["start_method"]}  # the inner call: no preload
        context = self.start(nested, args=(pids_queue, 20.0, kwargs), nprocs=1, join=False)
        pids, names, tempdir = pids_queue.get(timeout=60)
        start = time.time()
        while pids:
            pids = [p for p in pids if _alive(p)]
            self.assertLess(time.time() - start, 10.0, "nested children still alive: %s" % pids)
            time.sleep(0.1)
        with self.assertRaises(mp.ProcessExitedException):
            context.join()
        # Nothing of multiprocessing's is left by the killed process (as torch.multiprocessing's parent's
        # resource tracker unlinks them): its semaphores' names, unlinked by its resource tracker once the
        # process is gone, and its temporary folder. Names of the fork method are unlinked at creation.
        self.assertEqual(3, len(names))
        left = ["/dev/shm/sem." + n.lstrip("/") for n in names if n is not None]
        if tempdir != multiprocessing.process.current_process()._config.get("tempdir"):
            left.append(tempdir)  # not this process's own, which a forked child inherits (and this one removes)
        start = time.time()
        while left and time.time() - start < 10.0:
            left = [path for path in left if os.path.exists(path)]
            time.sleep(0.05)
        self.assertEqual([], left, "left by the killed process")

    # beyond torch's tests, per start method

    def test_return_values(self):
        self.assertEqual([square(i, 3)["value"] for i in range(3)],
                         [r["value"] for r in self.start(square, args=(3,), nprocs=3)])
        context = self.start(square, args=(1,), nprocs=2, join=False)
        with self.assertRaisesRegex(RuntimeError, "not all ended successfully"):
            context.return_values
        while not context.join():
            pass
        values = context.return_values
        self.assertEqual([1, 4], [v["value"] for v in values])
        self.assertEqual(context.pids(), [v["pid"] for v in values])

    def test_return_value_unpicklable(self):
        with self.assertRaisesRegex(mp.ProcessRaisedException,
                                    "process 1 returned a value that cannot be pickled for the parent \\(lock\\)"):
            self.start(return_unpicklable, nprocs=2)

    def test_args_list(self):
        self.assertEqual([(1, "a"), (1, "a")], self.start(echo_args, args=[1, "a"], nprocs=2))
        with self.assertRaisesRegex(TypeError, "args must be a tuple or another sequence"):
            self.start(echo_args, args="ab", nprocs=1)

    def test_shared_objects(self):
        ctx = mp.get_context(CONTEXT[self.method])
        queue = ctx.Queue()
        parent_end, child_end = ctx.Pipe()
        event = ctx.Event()
        lock = ctx.Lock()
        counter = ctx.Value("i", 0)
        self.start(use_shared, args=(queue, child_end, event, lock, counter), nprocs=3)
        self.assertEqual([("queue", 0), ("queue", 1), ("queue", 2)], sorted(queue.get(timeout=10) for _ in range(3)))
        self.assertTrue(parent_end.poll(10))
        self.assertEqual("pipe from 0", parent_end.recv())
        self.assertTrue(event.is_set())
        self.assertEqual(3, counter.value)

    def test_manager_proxies(self):
        with mp.get_context(CONTEXT[self.method]).Manager() as manager:
            d, items = manager.dict(), manager.list()
            self.start(use_proxies, args=(d, items), nprocs=2)
            self.assertEqual(({0: 0, 1: 10}, [0, 1]), (dict(d), sorted(items)))

    @unittest.skipUnless(HAVE_TORCH, "no torch")
    def test_shared_tensor(self):
        import torch
        t = torch.zeros(3)
        self.start(write_tensor, args=(t,), nprocs=3)
        self.assertEqual([1.0, 2.0, 3.0], t.tolist())  # the workers' writes, in the parent's tensor

    def test_processes_and_sentinels(self):
        ready = mp.get_context(CONTEXT[self.method]).SimpleQueue()
        context = self.start(sleep_forever, args=(ready,), nprocs=2, join=False)
        ready.get()
        ready.get()
        self.assertFalse(context.join(timeout=0.2))
        processes = context.processes
        self.assertEqual(context.pids(), [p.pid for p in processes])
        self.assertTrue(all(p.is_alive() and p.exitcode is None for p in processes))
        self.assertEqual({0, 1}, set(context.sentinels.values()))
        processes[1].terminate()
        ready_sentinels = multiprocessing.connection.wait(list(context.sentinels), timeout=30)
        # 1's, and 0's too once its stop (the failure of 1 stops it) came first
        self.assertIn(1, [context.sentinels[s] for s in ready_sentinels])
        with self.assertRaisesRegex(mp.ProcessExitedException, "process 1 terminated with signal SIGTERM"):
            context.join()
        self.assertEqual(-signal.SIGTERM, processes[1].exitcode)
        self.assertFalse(processes[0].is_alive())


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


class TorchContractSpawn(_Contract, unittest.TestCase):
    method = "spawn"

    def test_exception_raises(self):
        with self.assertRaises(mp.ProcessRaisedException):
            mp.spawn(success_then_raise, args=(), nprocs=1)

    def test_signal_raises(self):
        context = mp.spawn(sleep_forever, args=(), nprocs=1, join=False)
        for pid in context.pids():
            os.kill(pid, signal.SIGTERM)
        with self.assertRaises(mp.ProcessExitedException):
            context.join()

    def test_process_exited(self):
        with self.assertRaises(mp.ProcessExitedException) as e:
            mp.spawn(exit_with, args=([12],), nprocs=1)
        self.assertEqual(12, e.exception.exit_code)


class TorchContractForkserver(_Contract, unittest.TestCase):
    method = "forkserver"


class TorchContractFork(_Contract, unittest.TestCase):
    method = "fork"


class TorchContractPreload(_Contract, unittest.TestCase):
    method = "preload"


# -- 3. once -----------------------------------------------------------------------------------------

def _python(code, cwd, stdin=None, env=None, timeout=120):
    """Runs `code` as a script file (stdin=None) or on stdin (`python -`: a __main__ without a file)."""
    if stdin is None:
        path = os.path.join(cwd, "script.py")
        with open(path, "w") as f:
            f.write(textwrap.dedent(code))
        argv = [sys.executable, path]
    else:
        argv = [sys.executable, "-"]
    return subprocess.run(argv, cwd=cwd, input=None if stdin is None else textwrap.dedent(code),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


class Once(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lspawn-mp-test-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def test_bootstrap_guard(self):
        for method in ("spawn", "forkserver"):
            marks = os.path.join(self.dir, "ran-" + method)
            os.mkdir(marks)
            start = time.monotonic()
            out = _python("""
                import os, sys, lspawn
                def fn(i):
                    open(os.path.join(%r, "%%d.%%d" %% (os.getpid(), i)), "w").close()
                lspawn.spawn(fn, nprocs=2, start_method=%r)   # no main guard
                print("parent went on")
                """ % (marks, method), self.dir)
            took = time.monotonic() - start
            self.assertNotEqual(0, out.returncode, out.stdout)
            self.assertIn('if __name__ == "__main__":', out.stdout)
            self.assertIn("calls spawn() at top level", out.stdout)
            self.assertNotIn("parent went on", out.stdout)
            self.assertEqual([], os.listdir(marks), "fn ran: %s" % out.stdout)  # no process got as far as fn
            self.assertLess(took, 60)

    def test_notebook_main_function_and_lambda(self):
        code = """
            import lspawn
            class Box:                      # a class of this __main__, in args
                def __init__(self, v): self.v = v
            def fn(i, box):
                return box.v * 10 + i
            if __name__ == "__main__":
                for method in ("spawn", "forkserver"):
                    print(method, lspawn.spawn(fn, args=(Box(4),), nprocs=2, start_method=method))
                print("lambda", lspawn.spawn(lambda i: i * 7, nprocs=2))
            """
        if HAVE_CLOUDPICKLE:
            out = _python(code, self.dir, stdin=True)
            self.assertEqual(0, out.returncode, out.stdout)
            self.assertIn("spawn [40, 41]", out.stdout)
            self.assertIn("forkserver [40, 41]", out.stdout)
            self.assertIn("lambda [0, 7]", out.stdout)
        # Without cloudpickle: refused before anything starts, naming the extra.
        out = _python("import sys\nsys.modules['cloudpickle'] = None\n" + textwrap.dedent(code), self.dir,
                      stdin=True)
        self.assertNotEqual(0, out.returncode, out.stdout)
        self.assertIn("TypeError: lspawn.spawn: fn <function fn at", out.stdout)
        self.assertIn("pip install 'lspawn[notebook]'", out.stdout)

    @unittest.skipUnless(HAVE_CLOUDPICKLE and HAVE_TORCH, "no cloudpickle or no torch")
    def test_notebook_shares_tensors_and_pipes(self):
        # A function of a notebook's __main__ travels by value (cloudpickle); its args still as multiprocessing
        # and torch send them: the tensor's pages shared (the parent sees the writes), the pipe's end a real fd.
        code = """
            import lspawn, torch
            def fn(i, t, conn):
                t[i] = i + 1
                conn.send(i)
            if __name__ == "__main__":
                for method in ("spawn", "forkserver"):
                    t = torch.zeros(2)
                    ours, theirs = lspawn.get_context(method).Pipe()
                    lspawn.spawn(fn, args=(t, theirs), nprocs=2, start_method=method)
                    print(method, t.tolist(), sorted(ours.recv() if ours.poll(30) else -1 for _ in range(2)))
            """
        out = _python(code, self.dir, stdin=True)
        self.assertEqual(0, out.returncode, out.stdout)
        self.assertIn("spawn [1.0, 2.0] [0, 1]", out.stdout)
        self.assertIn("forkserver [1.0, 2.0] [0, 1]", out.stdout)

    def test_fork_refuses_python_threads(self):
        stop = threading.Event()
        t = threading.Thread(target=stop.wait, name="busy-helper")
        t.start()
        try:
            with self.assertRaisesRegex(RuntimeError, "start_method='fork' refused: other threads run in this "
                                                      "process \\(threading: busy-helper\\)"):
                mp.spawn(success, nprocs=1, start_method="fork")
            os.environ["LSPAWN_PRELOAD_ALLOW_THREADS"] = "1"
            try:
                values = mp.spawn(square, args=(0,), nprocs=2, start_method="fork")
                self.assertEqual([0, 1], [v["rank"] for v in values])
            finally:
                del os.environ["LSPAWN_PRELOAD_ALLOW_THREADS"]
        finally:
            stop.set()
            t.join()
        mp.spawn(success, nprocs=1, start_method="fork")  # the thread is gone: forks again

    @unittest.skipUnless(HAVE_TORCH, "no torch")
    def test_fork_refuses_cuda(self):
        import torch
        real = torch.cuda.is_initialized
        torch.cuda.is_initialized = lambda: True  # this machine has no GPU: the check is what is tested
        try:
            with self.assertRaisesRegex(RuntimeError, "refused: CUDA is initialised in this process"):
                mp.spawn(success, nprocs=1, start_method="fork")
        finally:
            torch.cuda.is_initialized = real

    @unittest.skipUnless(HAVE_TORCH, "no torch")
    def test_torch_exception_classes(self):
        import torch.multiprocessing as tmp
        for method in ("spawn", "fork"):
            with self.assertRaises(tmp.ProcessRaisedException) as e:
                mp.spawn(success_then_raise, args=(None,), nprocs=2, start_method=method)
            self.assertIsInstance(e.exception, mp.ProcessRaisedException)
            self.assertEqual(1, e.exception.error_index)
            with self.assertRaises(tmp.ProcessExitedException) as e:
                mp.spawn(exit_with, args=([0, 5],), nprocs=2, start_method=method)
            self.assertIsInstance(e.exception, mp.ProcessExitedException)
            self.assertEqual((1, 5), (e.exception.error_index, e.exception.exit_code))
            again = pickle.loads(pickle.dumps(e.exception))
            self.assertEqual((5, e.exception.error_pid), (again.exit_code, again.error_pid))

    def test_errors_pickleable(self):
        for error in (mp.ProcessRaisedException("Oh no!", 1, 1), mp.ProcessExitedException("Oh no!", 1, 1, 1)):
            again = pickle.loads(pickle.dumps(error))
            self.assertEqual((error.msg, error.error_index), (again.msg, again.error_index))

    def test_reexports(self):
        names = ("get_context", "set_start_method", "get_start_method", "Queue", "SimpleQueue", "Pipe", "Process",
                 "Manager", "Pool", "Lock", "Event", "cpu_count", "set_sharing_strategy", "get_sharing_strategy",
                 "get_all_sharing_strategies")
        for name in names:
            self.assertTrue(callable(getattr(mp, name)), name)
            self.assertIn(name, dir(mp))
        if HAVE_TORCH:
            import torch.multiprocessing as tmp
            for name in names:
                self.assertIs(getattr(tmp, name), getattr(mp, name), name)
        else:
            import multiprocessing
            self.assertIs(multiprocessing.get_context, mp.get_context)
            self.assertEqual("file_descriptor", mp.get_sharing_strategy())
            with self.assertRaisesRegex(ValueError, "without torch the only strategy"):
                mp.set_sharing_strategy("file_system")
        with self.assertRaisesRegex(AttributeError, "no attribute 'not_a_name'"):
            mp.not_a_name

    @unittest.skipUnless(HAVE_TORCH, "no torch")
    def test_install(self):
        import torch.multiprocessing as tmp
        from torch.multiprocessing.spawn import start_processes as before
        mp.install(grace_period=5)
        try:
            self.assertTrue(mp.installed())
            from torch.multiprocessing.spawn import start_processes as now
            self.assertIsNot(before, now)
            for call in (tmp.spawn, tmp.start_processes, now):
                found = call(lspawn_env, nprocs=2, join=False)
                while not found.join():
                    pass
                self.assertIn("LSPAWN_STATUS_DIR", found.return_values[0])  # a worker of lspawn's launcher
            with self.assertRaisesRegex(TypeError, "unknown option 'nprocs'"):
                mp.install(nprocs=3)
        finally:
            mp.uninstall()
        self.assertFalse(mp.installed())
        self.assertIs(before, tmp.start_processes)

    def test_fork_join_grace_period(self):
        path = os.path.join(self.dir, "term")
        # torch 2.x: after process 0 fails, the others get grace_period to end by themselves, then
        # SIGTERM, then SIGKILL after grace_period more: process 1 lingers 30 s after SIGTERM.
        context = mp.start_processes(record_term, args=(path, 30), nprocs=2, join=False, start_method="fork")
        start = time.monotonic()
        with self.assertRaisesRegex(mp.ProcessExitedException, "process 0 terminated with exit code 3"):
            while not context.join(grace_period=0.5):
                pass
        took = time.monotonic() - start
        self.assertTrue(os.path.exists(path + ".1"), "process 1 never got SIGTERM")
        self.assertEqual(-signal.SIGKILL, context.processes[1].exitcode)
        self.assertLess(took, 10)
        self.assertGreater(took, 0.9)  # the two grace periods
        with self.assertRaisesRegex(ValueError, "grace_period must be a number of seconds >= 0"):
            context.join(grace_period=-1)

    def test_daemon_socket(self):
        sock = os.path.join(self.dir, "d", "daemon.sock")
        binary = os.environ.get("LSPAWN_BIN") or "lspawn"
        daemon = subprocess.Popen([binary, "daemon", "--socket", sock], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, universal_newlines=True)
        try:
            deadline = time.monotonic() + 10
            while not os.path.exists(sock):
                self.assertIsNone(daemon.poll(), "the daemon exited")
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.01)
            for _ in range(2):
                self.assertEqual([0, 1], [v["rank"] for v in
                                          mp.spawn(square, args=(0,), nprocs=2, preload=["json"], daemon_socket=sock)])
            status = subprocess.run([binary, "daemon", "--status", "--socket", sock], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, universal_newlines=True, timeout=30).stdout
            self.assertIn("runs 2", status)  # both calls forked from the one forkserver of that daemon
            with self.assertRaisesRegex(ValueError, "daemon_socket does not apply to start_method='fork'"):
                mp.spawn(success, nprocs=1, start_method="fork", daemon_socket=sock)
        finally:
            daemon.terminate()
            daemon.wait(10)


if __name__ == "__main__":
    unittest.main()
