"""Runs N real ranks of a test script for the torch.distributed backend `lspawn` (tests/python_backend/).

The parent holds a TCPStore server on port 0 (the kernel's choice) and starts N processes of the same Python
running `script --worker`; each joins with RANK/WORLD_SIZE and the store's port, runs the script's worker(), and
exits 0 when every check passed. The parent fails when any rank fails or the ranks outlive `timeout` (then every
rank is killed: nothing is left behind). The environment comes from ctest (tests/python_backend/CMakeLists.txt):
PYTHONPATH (the source tree's python/), LSPAWN_ENGINE, LSPAWN_BACKEND_SHIM_DIR.
"""
import datetime
import os
import signal
import subprocess
import sys
import time

SKIP = 77  # ctest's SKIP_RETURN_CODE


def store_server():
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=120), wait_for_workers=False)


def client_store():
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", int(os.environ["LSPAWN_TEST_STORE_PORT"]), int(os.environ["WORLD_SIZE"]) + 1,
                         False, datetime.timedelta(seconds=120))


def run_ranks(script, n, extra_args=(), timeout=180, env=None, expect=None, rank_env=None, check=True):
    """Starts n ranks of `script --worker`; returns [(rank, exit code, output)]. expect: {rank: code} that
    must hold (default: every rank 0; check=False: the caller looks). rank_env(rank): more environment for
    that rank. Also bench/python_backend's way of starting ranks."""
    server = store_server()
    procs = []
    base = dict(os.environ, **(env or {}))
    for rank in range(n):
        e = dict(base, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n),
                 LSPAWN_TEST_STORE_PORT=str(server.port), OMP_NUM_THREADS="1")
        e.update(rank_env(rank) if rank_env else {})
        procs.append(subprocess.Popen([sys.executable, script, "--worker"] + list(extra_args), env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    deadline = time.monotonic() + timeout
    results = []
    for rank, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, _ = p.communicate()
            out += "\n[harness] rank %d still running after %d s: killed every rank" % (rank, timeout)
            p.returncode = -9
        results.append((rank, p.returncode, out))
    if not check:
        return results
    expect = expect if expect is not None else {r: 0 for r in range(n)}
    bad = [(r, c) for r, c, _ in results if r in expect and expect[r] is not None and c != expect[r]]
    if bad:
        for r, c, out in results:
            print("---- rank %d (exit %s) ----\n%s" % (r, c, out))
        raise SystemExit("FAILED: ranks %s exited %s, expected %s" % ([r for r, _ in bad], [c for _, c in bad],
                                                                     [expect[r] for r, _ in bad]))
    return results


def run_worker(worker):
    """Runs a test's worker() and ends the rank with its exit code (SystemExit's; 1 and the traceback on an
    exception) without the interpreter's teardown. The workers that compare with a gloo group need it: torch's
    ProcessGroupGloo aborts a process that exits with it alive in 1 of 3 to 4 runs here ("terminate called
    without an active exception", SIGABRT after every check passed; torch 2.15, gloo alone, with or without
    destroy_process_group while a DDP still holds the group; pytorch/pytorch#190489)."""
    import traceback
    code = 0
    try:
        worker()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:  # sys.exit("message"): printed, exit 1, as Python does
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def torch_release():
    """(major, minor) of the torch imported here, e.g. (2, 15)."""
    import torch
    return tuple(int(x) for x in torch.__version__.split(".")[:2])


def torch_major():
    return torch_release()[0]


def init(backend=None):
    """Joins the default group on `backend` (default: the lspawn backend for CPU tensors) through the store."""
    import lspawn.distributed  # noqa: F401
    import torch.distributed as dist
    if backend is None:
        backend = "cpu:lspawn" if torch_major() >= 2 else "lspawn"
    dist.init_process_group(backend, store=dist.PrefixStore("test/", client_store()),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=60))
    return dist
