"""A torch-free worker of the shm backend for bench/soak/soak.py: lspawn's engine
(shm/engine.h, liblspawn_engine.so) through ctypes, its segment's name rendezvous through files.

    lspawn --nproc-per-node 2 python3 shm_worker.py      (RANK, WORLD_SIZE from lspawn)

Environment: SOAK_ENGINE (the library), SOAK_STORE (a directory shared by the ranks, fresh per
job), SOAK_LABEL (put into the segment's name: /dev/shm/lspawn-<label>-<pid>-<random>).
Each rank all_reduces 1024 floats (sum) in a loop for ever; after 20 of them it writes
SOAK_STORE/inloop-<rank> (its pid), so that the soak kills it inside the loop, i.e. inside (or
between two) shared-memory collectives. It exits 1 naming the error when a peer dies."""
import ctypes
import os
import sys
import time


class Err(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("rank", ctypes.c_int), ("message", ctypes.c_char * 1024)]


SET_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                          ctypes.c_size_t, ctypes.POINTER(Err))
GET_FN = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                          ctypes.c_size_t, ctypes.POINTER(Err))
STORE = os.environ["SOAK_STORE"]


def key_path(key):
    return os.path.join(STORE, key.decode().replace("/", "_"))


def fail(err, text):
    err.contents.kind = 5  # LSPAWN_ENGINE_SYSTEM
    err.contents.rank = -1
    err.contents.message = text.encode()[:1000]


@SET_FN
def file_set(_ctx, key, value, length, err):
    path = key_path(key)
    try:
        with open(path + ".tmp%d" % os.getpid(), "wb") as f:
            f.write(ctypes.string_at(value, length))
        os.rename(path + ".tmp%d" % os.getpid(), path)
        return 0
    except OSError as e:
        fail(err, "file_set %s: %s" % (path, e))
        return -1


@GET_FN
def file_get(_ctx, key, buf, cap, err):
    path = key_path(key)
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            fail(err, "file_get %s: not there after 30 s" % path)
            return -1
        time.sleep(0.001)
    with open(path, "rb") as f:
        data = f.read()
    ctypes.memmove(buf, data, min(len(data), cap))
    return len(data)


def main():
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    lib = ctypes.CDLL(os.environ["SOAK_ENGINE"])
    lib.lspawn_engine_create.restype = ctypes.c_void_p
    lib.lspawn_engine_create.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int64,
                                         ctypes.c_void_p, SET_FN, GET_FN, ctypes.c_void_p,
                                         ctypes.POINTER(Err)]
    lib.lspawn_engine_all_reduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.c_int, ctypes.c_int, ctypes.POINTER(Err)]
    err = Err()
    if rank != 0 and os.environ.get("SOAK_LATE_PEERS"):  # rank 0 waits in the segment's first barrier
        with open(os.path.join(STORE, "late-%d" % rank), "w") as f:
            f.write(str(os.getpid()))
        while not os.path.exists(os.path.join(STORE, "go-late")):
            time.sleep(0.005)
    if rank == 0:
        with open(os.path.join(STORE, "creating-0"), "w") as f:
            f.write(str(os.getpid()))
    engine = lib.lspawn_engine_create(rank, size, os.environ["SOAK_LABEL"].encode(), 30000, None,
                                      file_set, file_get, None, ctypes.byref(err))
    if not engine:
        sys.exit("rank %d: lspawn_engine_create: %s" % (rank, err.message.decode()))
    data = (ctypes.c_float * 1024)()
    n = 0
    while True:
        for i in range(len(data)):
            data[i] = 1.0
        if lib.lspawn_engine_all_reduce(engine, data, len(data), 0, 0, ctypes.byref(err)) != 0:
            sys.exit("rank %d: all_reduce %d: %s" % (rank, n, err.message.decode()))
        if data[0] != float(size):
            sys.exit("rank %d: all_reduce %d: %r, expected %d" % (rank, n, data[0], size))
        n += 1
        if n == 20:
            with open(os.path.join(STORE, "inloop-%d.tmp" % rank), "w") as f:
                f.write(str(os.getpid()))
            os.rename(os.path.join(STORE, "inloop-%d.tmp" % rank), os.path.join(STORE, "inloop-%d" % rank))


if __name__ == "__main__":
    main()
