"""Hang diagnosis for Python workers: the Python side of lspawn's live hang report.

lspawn's launcher reads, while a job runs, one status record per rank (`$LSPAWN_STATUS_DIR/rank-<R>.status`,
status/layout.hpp) and on `--hang-timeout`, SIGURG or `lspawn status PID` says which ranks wait in which
collective and which are behind, with the stacks of the ranks behind (docs/hang-diagnosis.md). A C++ worker's
collectives write that record themselves; a Python worker's collectives are torch's, so this module writes it
for them:

    import lspawn_hang
    lspawn_hang.install()          # once per worker process, as early as possible (see below)

- **which collective**: from torch's Flight Recorder, which records every collective of every process group
  (gloo's readable from torch 2.8, NCCL's too; on by default with 2000 entries from 2.11, and turned on
  here, TORCH_FR_BUFFER_SIZE=2000, for 2.8-2.10, which ship it off, unless the user set the variable). A thread of this module reads
  its per-group status (last enqueued / last completed collective: ~0.15 ms) every 0.2 s and mirrors it into
  the record: group `world` (the default group) or `pg<name>`, sequence number, in a collective or not; when
  a state has held for one more poll (a wait, or a rank that stopped calling collectives) it reads the whole
  buffer once (20-45 ms for 2000 entries) for the op's name, payload and start time. So the record lags torch
  by up to ~0.4 s, and a busy job costs one cheap read per 0.2 s. Without a Flight Recorder (torch 1.x,
  or TORCH_FR_BUFFER_SIZE=0) install() wraps torch.distributed's collectives instead (all_reduce, broadcast, barrier, ...; the object
  collectives show as the tensor ops they run): the record is then written by the calling thread at each
  call's start and end, like lspawn's C++ collectives; what bypasses those Python functions (DDP's C++
  reducer) goes unrecorded, an async_op=True call counts as done when issued, and a script that bound a
  function before install() (`from torch.distributed import all_reduce`) keeps the unwrapped one.
- **the Python stack**: the record announces SIGURG as its stack signal; the same thread waits for it
  (`signal.sigtimedwait`: SIGURG is blocked in the calling thread, and so in every thread it starts later) and
  writes the main thread's Python stack (`sys._current_frames()`, most recent call last) to
  `rank-<R>.stack`, atomically (temp + rename), in the format the launcher reads (status/stack_dump.hpp). The
  main thread is never interrupted: a rank sleeping or blocked in a C++ collective (which releases the GIL)
  answers at once. Fatal signals (SIGSEGV, SIGABRT, ...) print every thread's Python stack to stderr
  (`faulthandler.enable()`), so they reach the launcher's log with the rank's prefix.

Where it runs:
- `lspawn --preload torch[,...] python3 train.py`: the preload bootstrap calls install() in each worker after
  the fork, before the script.
- `lspawn python3 train.py` (exec): nothing of lspawn runs inside a plain `python3 train.py`, so its ranks have
  no record ("has no status record" in a report). `lspawn ... python3 -m lspawn_hang train.py ARGS` (with this
  directory on PYTHONPATH) runs install() and then the script as `__main__`, unchanged (as `python -m
  cProfile` does); or the script calls install() itself.

Outside lspawn (no LSPAWN_STATUS_DIR or RANK) install() does nothing and returns False.
"""
import atexit
import mmap
import os
import signal
import struct
import sys
import threading
import time
import traceback

__all__ = ["install", "installed", "claim_slot", "install_cpu_backend"]

# status/layout.hpp, kVersion 1: FileHeader (88 bytes), then kMaxGroups GroupSlots (176 bytes each).
_MAGIC = b"LSPSTAT\0"
_VERSION = 1
_HEADER_BYTES = 88
_SLOT_BYTES = 176
_MAX_GROUPS = 32
_FILE_BYTES = _HEADER_BYTES + _MAX_GROUPS * _SLOT_BYTES
_NAME_BYTES = 64
_OP_BYTES = 24
# FileHeader byte offsets.
_H_STACK_SIGNAL = 40
_H_GROUPS = 44
_H_GROUPS_DROPPED = 48
# GroupSlot byte offsets.
_S_GROUP_RANK = 64
_S_GROUP_SIZE = 68
_S_VERSION = 72
_S_STATE = 80
_S_SEQ = 88
_S_OP = 96
_S_BYTES = 120
_S_SINCE = 128
_S_COMPLETED_SEQ = 136
_S_COMPLETED_OP = 144
_S_COMPLETED_US = 168
_IDLE, _IN_COLLECTIVE = 0, 1

STACK_SIGNAL = signal.SIGURG
# The first line after "pid N python" in a stack file: tells the launcher's report that the lines are a
# Python traceback (status/stack_dump.hpp: kPythonStackHead).
PYTHON_STACK_HEAD = "Python main thread (most recent call last):"
STACK_END = "-- end of stack --"
POLL_S = 0.2
STOP_S = 2.0  # at exit, how long stop() waits for the watch thread (it answers within one dump)
MAX_FRAMES = 64  # two lines each (file/line/function, source): within the 200 lines a report shows

_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
                "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16}

_installed = None  # the _Watch of this process


def _now_us():
    return time.time_ns() // 1000


class _Record:
    """The rank's status record, created and written as status/recorder.cpp does: one writer (the watch
    thread), every mutable slot field inside a seqlock write section (version odd, fields, version even).
    Each field is one aligned store through a memoryview (x86 keeps stores in program order)."""

    def __init__(self, directory, rank):
        self.path = os.path.join(directory, "rank-%d.status" % rank)
        tmp = "%s.tmp.%d" % (self.path, os.getpid())
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, _FILE_BYTES)
            self._map = mmap.mmap(fd, _FILE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        m = self._map
        struct.pack_into("<8sIIIIiiq", m, 0, _MAGIC, _VERSION, _HEADER_BYTES, _SLOT_BYTES, _MAX_GROUPS, rank,
                         os.getpid(), _now_us())
        self._u32 = memoryview(m).cast("I")
        self._u64 = memoryview(m).cast("Q")
        self._i64 = memoryview(m).cast("q")
        os.rename(tmp, self.path)  # publishes the initialised file
        self._groups = 0
        self._lock = threading.Lock()  # groups may be created from several threads

    def set_stack_signal(self, sig):
        self._u32[_H_STACK_SIGNAL // 4] = int(sig)

    def add_group(self, name, group_rank, group_size):
        """Claims a slot; its index, or None when the slots ran out."""
        with self._lock:
            return self._add_group(name, group_rank, group_size)

    def _add_group(self, name, group_rank, group_size):
        if self._groups >= _MAX_GROUPS:
            self._u32[_H_GROUPS_DROPPED // 4] += 1
            return None
        i = self._groups
        base = _HEADER_BYTES + i * _SLOT_BYTES
        raw = name.encode()[:_NAME_BYTES - 1]
        self._map[base:base + _NAME_BYTES] = raw + b"\0" * (_NAME_BYTES - len(raw))
        struct.pack_into("<ii", self._map, base + _S_GROUP_RANK, group_rank, group_size)
        self._i64[(base + _S_SINCE) // 8] = _now_us()
        self._groups = i + 1
        self._u32[_H_GROUPS // 4] = self._groups  # after the name: a reader sees the slot named
        return i

    def write(self, i, in_collective, seq, op, nbytes, since_us, completed_seq, completed_op, completed_us):
        """One seqlock write section setting every mutable field of slot i."""
        base = _HEADER_BYTES + i * _SLOT_BYTES
        v = self._u64[(base + _S_VERSION) // 8]
        self._u64[(base + _S_VERSION) // 8] = v + 1
        self._u32[(base + _S_STATE) // 4] = _IN_COLLECTIVE if in_collective else _IDLE
        self._u64[(base + _S_SEQ) // 8] = seq
        self._put_name(base + _S_OP, op)
        self._u64[(base + _S_BYTES) // 8] = nbytes
        self._i64[(base + _S_SINCE) // 8] = since_us
        self._u64[(base + _S_COMPLETED_SEQ) // 8] = completed_seq
        self._put_name(base + _S_COMPLETED_OP, completed_op)
        self._i64[(base + _S_COMPLETED_US) // 8] = completed_us
        self._u64[(base + _S_VERSION) // 8] = v + 2

    def _put_name(self, offset, name):
        raw = name.encode()[:_OP_BYTES - 1]
        raw += b"\0" * (_OP_BYTES - len(raw))
        for w in range(_OP_BYTES // 8):
            self._u64[offset // 8 + w] = int.from_bytes(raw[8 * w:8 * w + 8], "little")


class _Slot:
    """What this rank's record says of one process group, and what the Flight Recorder said last."""

    def __init__(self, index):
        self.index = index
        self.written = None   # (enqueued, completed, names resolved) as written
        self.names = {}       # seq -> (op, bytes, started_us), from full reads
        self.since_us = 0
        self.completed_us = 0


class _Watch:
    def __init__(self, record, directory, rank):
        self.record = record
        self.stack_path = os.path.join(directory, "rank-%d.stack" % rank)
        self.main_ident = threading.main_thread().ident
        self.slots = {}         # pg name -> _Slot
        self.dropped = set()    # pg names that found no free slot
        self.last_seen = None   # the Flight Recorder's status at the previous poll
        self.settled = 0        # polls it has not changed for
        # Read once torch is there (_when_imported): {} until then.
        self.backends = self._backends() if "torch" in sys.modules else {}
        self.answers_stacks = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="lspawn-hang-watch", daemon=True)

    # -- the Flight Recorder ------------------------------------------------------------------------------

    @staticmethod
    def _backends():
        """{backend: dump(entries) -> dict} for each Flight Recorder of this torch that answers a first read.

        Two APIs: torch 2.15 has one function for every recorder, `_dump_fr_trace_json(..., backend=B)`; the
        releases before it (2.11: `_dump_fr_trace_json(includeCollectives, onlyActive)`) dump gloo's (the
        CPU recorder) with that function and NCCL's with `_dump_nccl_trace_json`. Which one this torch has is
        decided by asking, not by its version. Empty: no recorder, and the wrapped functions record."""
        import json
        try:
            from torch._C import _distributed_c10d as c10d
        except Exception:
            return {}
        _flight_recorder_on()  # before this function's first read sizes the recorder
        if not hasattr(c10d, "_dump_fr_trace_json"):
            return {}  # no Flight Recorder in this torch: the wrapped functions record
        for var in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):  # torch's precedence
            value = os.environ.get(var, "")
            if value:
                try:
                    if int(value) <= 0:
                        return {}  # the user turned the recorder off: the wrapped functions record
                except ValueError:
                    pass
                break

        def by_name(backend):
            return lambda entries: json.loads(c10d._dump_fr_trace_json(includeCollectives=entries, backend=backend))

        # The first read of gloo's recorder by name also tells which API this is.
        answering = {}
        try:
            by_name("gloo")(False)
            answering["gloo"] = by_name("gloo")
            candidates = {"nccl": by_name("nccl")}
        except TypeError:  # pybind refused the argument: the API before 2.15
            candidates = {"gloo": lambda entries: json.loads(c10d._dump_fr_trace_json(includeCollectives=entries))}
            if hasattr(c10d, "_dump_nccl_trace_json"):
                candidates["nccl"] = lambda entries: json.loads(c10d._dump_nccl_trace_json(includeCollectives=entries))
        except Exception:  # the argument was taken, gloo's recorder did not answer: not used
            candidates = {"nccl": by_name("nccl")}
        for name, dump in candidates.items():
            try:
                dump(False)
            except Exception:
                continue  # not built in, or not usable here
            answering[name] = dump
        return answering

    def _dump(self, backend, entries):
        return self.backends[backend](entries)

    def _status(self):
        """{pg name: (last enqueued, last completed)} over every backend that answers."""
        out = {}
        for b in list(self.backends):
            try:
                d = self._dump(b, False)
            except Exception:
                self.backends.pop(b, None)  # stopped answering: never asked again
                continue
            for name, s in (d.get("pg_status") or {}).items():
                e = int(s.get("last_enqueued_collective", -1))
                c = int(s.get("last_completed_collective", -1))
                pe, pc = out.get(name, (-1, -1))
                out[name] = (max(e, pe), max(c, pc))
        return out

    def _resolve(self, wanted):
        """Op name, payload and start of the collectives `wanted` ({pg name: set of seqs}) from one full read."""
        for b in list(self.backends):
            try:
                d = self._dump(b, True)
            except Exception:
                continue
            for e in d.get("entries") or []:
                pg = e.get("process_group") or ["", ""]
                seq = e.get("collective_seq_id", 0)
                if pg[0] not in wanted or seq not in wanted[pg[0]] or e.get("is_p2p"):
                    continue
                op = str(e.get("profiling_name", "collective")).split(":", 1)[-1]
                nbytes = 0
                for size, dtype in zip(e.get("input_sizes") or [], e.get("input_dtypes") or []):
                    n = 1
                    for d_ in size:
                        n *= d_
                    nbytes += n * _DTYPE_BYTES.get(dtype, 4)
                started = int(e.get("time_created_ns", 0)) // 1000
                self.slots[pg[0]].names[seq] = (op, nbytes, started)

    def _group_of(self, pg_name):
        """(slot name, this rank's rank in it, its size) of torch's process group `pg_name`."""
        try:
            import torch.distributed.distributed_c10d as c10d
            world = c10d._world
            for pg, name in list(world.pg_names.items()):
                if name != pg_name:
                    continue
                ranks = world.pg_group_ranks.get(pg, {})
                me = ranks.get(int(os.environ["RANK"]), 0)
                label = "world" if pg is world.default_pg else "pg" + name
                return label, me, len(ranks) or pg.size()
        except Exception:
            pass
        return "pg" + pg_name, 0, 0

    def poll(self):
        status = self._status()
        if status != self.last_seen:
            self.last_seen = status
            self.settled = 0
        else:
            self.settled += 1
        now = _now_us()
        if self.settled == 1:  # held for a poll: name its ops (one full read), once per state
            wanted = {}
            for name, (e, c) in status.items():
                slot = self.slots.get(name)
                need = {s for s in (e, c) if s > 0 and (slot is None or s not in slot.names)}
                if need:
                    wanted[name] = need
            if wanted:
                for name in wanted:
                    if name not in self.slots:
                        self._add(name)
                if any(name in self.slots for name in wanted):
                    self._resolve({k: v for k, v in wanted.items() if k in self.slots})
        for name, (e, c) in status.items():
            if e <= 0 and c <= 0:
                continue
            slot = self.slots.get(name) or self._add(name)
            if slot is None:
                continue
            resolved = all(s <= 0 or s in slot.names for s in (e, c))
            state = (e, c, resolved)
            if state == slot.written:
                continue
            if slot.written is None or slot.written[:2] != (e, c):
                slot.since_us = now
                if slot.written is None or slot.written[1] != c:
                    slot.completed_us = now
            op, nbytes, started = slot.names.get(e, ("collective", 0, slot.since_us))
            cop = slot.names.get(c, ("collective", 0, 0))[0]
            inside = e > c
            self.record.write(slot.index, inside, max(e, 0), op, nbytes, started if inside else slot.since_us,
                              max(c, 0), cop if c > 0 else "", slot.completed_us)
            slot.written = state
            # Names of ops long gone are not needed again.
            for s in [s for s in slot.names if s < c]:
                del slot.names[s]

    def _add(self, pg_name):
        if pg_name in self.dropped:
            return None
        label, group_rank, size = self._group_of(pg_name)
        i = self.record.add_group(label, group_rank, size)
        if i is None:
            self.dropped.add(pg_name)  # counted once in the header's groups_dropped
            return None
        slot = _Slot(i)
        self.slots[pg_name] = slot
        return slot

    # -- the stack --------------------------------------------------------------------------------------------

    def write_stack(self):
        frame = sys._current_frames().get(self.main_ident)
        lines = ["pid %d python" % os.getpid(), PYTHON_STACK_HEAD]
        if frame is None:
            lines.append("  (the main thread has no Python frame)")
        else:
            frames = traceback.extract_stack(frame)
            # python -m lspawn_hang, lspawn --preload: the runner's own frames (runpy, this file, the preload
            # server) above the script's are noise.
            while len(frames) > 1 and (frames[0].filename in (__file__, "<frozen runpy>")
                                       or frames[0].filename.endswith(("runpy.py", "lspawn_preload.py", "/lspawn_hang.py"))):
                frames = frames[1:]
            if len(frames) > MAX_FRAMES:  # the launcher keeps 200 lines: keep the innermost frames
                lines.append("  ... %d outer frames left out" % (len(frames) - MAX_FRAMES))
                frames = frames[-MAX_FRAMES:]
            for entry in traceback.format_list(frames):
                lines.extend(entry.rstrip("\n").split("\n")[:2])
        lines.append(STACK_END)
        _write_atomically(self.stack_path, "\n".join(lines) + "\n")

    def stop(self, timeout=STOP_S):
        """Ends the watch thread and waits for it (at most `timeout` s): at exit, before the interpreter finalizes.

        The thread is a daemon, and its poll calls torch's Flight Recorder dump, which releases the GIL. CPython
        <= 3.13 ends a daemon thread that wants the GIL back while the interpreter finalizes with pthread_exit();
        inside pybind11's gil_scoped_release destructor (noexcept) that is std::terminate ("terminate called
        without an active exception"). Suspected, not shown, for #47's abort at exit (docs/reliability.md, "A
        rank aborts at exit"); stopped here, no thread of lspawn's is left in the worker when it finalizes. A
        dump under way is waited for (20-45 ms); SIGURG (blocked in the thread, which waits for it) wakes it.
        """
        if self.pid != os.getpid() or not self.thread.is_alive():
            return  # a forked child (the thread is the parent's) or stopped already
        self.stopping.set()
        if self.answers_stacks:
            try:
                signal.pthread_kill(self.thread.ident, STACK_SIGNAL)
            except (OSError, ValueError):
                pass
        self.thread.join(timeout)

    def _run(self):
        deadline = time.monotonic() + POLL_S
        while not self.stopping.is_set():
            try:
                wait = max(0.0, deadline - time.monotonic())
                if self.answers_stacks:
                    got = signal.sigtimedwait([STACK_SIGNAL], wait)
                else:  # the program's own SIGURG handler: never take its signals
                    self.stopping.wait(wait)
                    got = None
                if self.stopping.is_set():
                    return
                if got is not None:
                    self.write_stack()
                    continue
                deadline = time.monotonic() + POLL_S
                if self.backends:
                    self.poll()
            except Exception as e:  # never take the worker down; say it once and stop recording
                print("lspawn: rank %s: hang diagnosis stopped: %s: %s" % (os.environ.get("RANK", "?"),
                      type(e).__name__, e), file=sys.stderr, flush=True)
                return


class _Wrapped:
    """Torch without a Flight Recorder: torch.distributed's collectives, wrapped, write the record from the
    calling thread (one thread issues a group's collectives, as for lspawn's own)."""

    OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
           "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all",
           "all_to_all_single", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv")

    def __init__(self, record):
        self.record = record
        self.slots = {}  # id(process group) -> [slot index, seq, last completed seq, its op, pg]

    def install(self):
        import inspect
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        for name in self.OPS:
            fn = getattr(c10d, name, None)
            if fn is None or getattr(fn, "_lspawn_hang", False):
                continue
            wrapped = self._wrap(name.lstrip("_").replace("_base", ""), fn, inspect.signature(fn), c10d)
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is fn:
                setattr(dist, name, wrapped)

    def _slot(self, c10d, group):
        pg = group if group is not None else c10d._get_default_group()
        entry = self.slots.get(id(pg))
        if entry is None:
            try:
                native = "lspawn" in str(c10d.get_backend(pg)).lower()
            except Exception:
                native = False
            if native:  # the backend `lspawn` records its ops itself (lspawn.distributed, claim_slot)
                entry = self.slots[id(pg)] = [None, 0, 0, "", pg]
                return entry
            if pg is c10d._get_default_group():
                label = "world"
            else:
                label = "pg" + str(c10d._world.pg_names.get(pg, len(self.slots)))
            i = self.record.add_group(label, c10d.get_rank(pg), c10d.get_world_size(pg))
            entry = self.slots[id(pg)] = [i, 0, 0, "", pg]
        return entry

    def _wrap(self, op, fn, sig, c10d):
        import functools
        import torch

        def payload(x):
            if isinstance(x, torch.Tensor):
                return x.numel() * x.element_size()
            if isinstance(x, (list, tuple)):
                return sum(payload(y) for y in x)
            return 0

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                bound = sig.bind_partial(*args, **kwargs).arguments
                group = bound.get("group")
                if not c10d.is_initialized() or c10d._rank_not_in_group(group):
                    raise LookupError
                entry = self._slot(c10d, group)
            except Exception:  # not recordable (bad arguments: the call itself says so)
                return fn(*args, **kwargs)
            if entry[0] is None:
                return fn(*args, **kwargs)
            entry[1] += 1
            seq, now = entry[1], _now_us()
            first = next(iter(bound.values()), None)
            self.record.write(entry[0], True, seq, op, payload(first), now, entry[2], entry[3], now)
            try:
                return fn(*args, **kwargs)
            finally:
                done = _now_us()
                entry[2], entry[3] = seq, op
                self.record.write(entry[0], False, seq, op, payload(first), done, seq, op, done)

        wrapper._lspawn_hang = True
        return wrapper


class _WhenImported:
    """A sys.meta_path finder that calls then() once the module `name` has been executed, and removes itself."""

    def __init__(self, name, then):
        self.name, self.then, self.busy = name, then, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.busy:
            return None
        import importlib.util
        self.busy = True  # the finders after this one find the real spec
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        real, finder = spec.loader, self

        class Loader:
            def __getattr__(self, name):  # the rest of the loader's API (get_code, is_package, resources)
                return getattr(real, name)

            def create_module(self, spec):
                return real.create_module(spec)

            def exec_module(self, module):
                module.__loader__ = real
                real.exec_module(module)
                if finder in sys.meta_path:
                    sys.meta_path.remove(finder)
                finder.then()

        spec.loader = Loader()
        return spec


def _write_atomically(path, text):
    """`text` into `path` through a temporary file renamed over it: a reader (the launcher) sees the old file or
    the new one, never a part. The temporary file does not outlive a failure, which is raised."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _mark_phase(directory, rank, phase):
    """The restart policy's marker (status/phase.hpp): rank-<R>.<phase> in the status directory, holding this
    process's pid. Best effort: a marker is a hint, never a failure."""
    try:
        _write_atomically(os.path.join(directory, "rank-%d.%s" % (rank, phase)), "%d\n" % os.getpid())
    except OSError:
        pass


def _mark_rendezvous_on_init(directory, rank):
    """Wraps torch.distributed.init_process_group: entering it writes the "rendezvous" marker, so that a failure
    before it (an ImportError, a bad argument) is known to come before the rendezvous and is not restarted."""
    import functools
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    fn = getattr(c10d, "init_process_group", None)
    if fn is None or getattr(fn, "_lspawn_phase", False):
        return

    @functools.wraps(fn)
    def init_process_group(*args, **kwargs):
        _mark_phase(directory, rank, "rendezvous")
        return fn(*args, **kwargs)
    init_process_group._lspawn_phase = True
    c10d.init_process_group = init_process_group
    if getattr(dist, "init_process_group", None) is fn:
        dist.init_process_group = init_process_group


def _when_imported(name, then):
    """Calls then() once the module `name` has been executed: now if it has been already, else from the
    import that executes it (_WhenImported)."""
    if name in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _WhenImported(name, then))


def no_multiprocessing_leftovers(directory, name):
    """A worker that lspawn kills leaves nothing of multiprocessing's (docs/python.md, "A killed worker leaves
    nothing"): no semaphore names in /dev/shm (its resource tracker out of its process group:
    _tracker_out_of_group), and no `pymp-*` folder in TMPDIR (its temporary folder made as `directory`/`name`,
    in a folder lspawn removes after the run, or its guardian if lspawn is killed: _temp_dir_in; none without
    a directory). Each is set when multiprocessing imports the module it patches (importing multiprocessing
    costs ~40 ms: not here), or now if it has."""
    tracker = "multiprocessing.resource_tracker"
    _when_imported(tracker, lambda: _tracker_out_of_group(sys.modules[tracker]))
    if directory:
        _temp_dir_in(directory, name)


def _temp_dir_in(directory, name):
    """multiprocessing's temporary folder of this process (util.get_temp_dir(): the resource sharer's socket, a
    heap's file, a forkserver's socket) as `directory`/`name` instead of a `pymp-*` in TMPDIR, which a killed
    process leaves there. Children forked later share it, as they share a `pymp-*`. Never over a folder
    already chosen, nor where the socket names would not fit."""
    path = os.path.join(directory, name)
    if len(path) >= 70:  # multiprocessing's socket names (listener-XXXXXXXX) must fit in 107 bytes
        return

    def use(module):
        config = module.current_process()._config
        if "tempdir" in config or not os.path.isdir(directory):
            return
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        config["tempdir"] = path

    process = "multiprocessing.process"
    _when_imported(process, lambda: use(sys.modules[process]))


def _tracker_out_of_group(module):
    """multiprocessing's resource tracker for this worker, out of its process group, so that a worker lspawn
    kills leaves no semaphore names in /dev/shm.

    The tracker unlinks the names (a Queue has 3) that its clients registered and did not unlink, once the
    last of them, the holders of its pipe, is gone. torch.multiprocessing's children share their parent's
    tracker, and torchrun stops a worker's group with SIGTERM, which the tracker ignores: it outlives the
    worker and cleans up. lspawn kills a failed or stopped worker's group at once with SIGKILL (no
    grandchild outlives its worker), and multiprocessing starts the tracker as the worker's child, in that
    group: it died too, and the names stayed. Here the tracker is started in a session of its own (setsid),
    when first needed, as multiprocessing starts it (most workers never need one); it ends by itself once
    the worker and its children are gone. A tracker already known (inherited through fork) is kept."""
    tracker = getattr(module, "_resource_tracker", None)
    if tracker is None or getattr(tracker, "_fd", None) is not None or getattr(tracker, "_lspawn", False):
        return
    import threading
    lock, default = threading.Lock(), tracker.ensure_running

    def ensure_running():  # what register(), unregister() and getfd() call, and what the module exports
        with lock:
            if tracker._fd is None:
                _start_tracker(tracker)
        default()  # multiprocessing's own: is it alive (a dead one is started again, as a child)

    tracker.ensure_running = module.ensure_running = ensure_running
    tracker._lspawn = True


def _start_tracker(tracker):
    from multiprocessing import spawn, util
    r, w = os.pipe()
    try:
        os.set_inheritable(r, True)
        exe = spawn.get_executable()
        args = [exe] + util._args_from_interpreter_flags()
        args += ["-c", "from multiprocessing.resource_tracker import main;main(%d)" % r]
        # As multiprocessing starts it (bpo-33613): SIGINT and SIGTERM blocked until it ignores them.
        pid = os.posix_spawn(exe, args, os.environ, setsid=True, setsigmask=(signal.SIGINT, signal.SIGTERM))
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    tracker._fd, tracker._pid = w, pid


def _flight_recorder_on():
    """Turns torch's Flight Recorder on where torch ships it off: 2.x up to 2.10 records nothing unless
    TORCH_FR_BUFFER_SIZE (or TORCH_NCCL_TRACE_BUFFER_SIZE) is set (FlightRecorder.hpp: a default of 0
    entries; 2000 from 2.11), and its recorder still answers a dump, with no group in it: the report
    then named no collective at all, where the wrapped functions would have (found by
    scripts/check-python-range.sh on 2.10). Sets TORCH_FR_BUFFER_SIZE=2000, 2.11's default, when
    neither variable is set; a value the user set, 0 included, is kept. Read by the recorder when it is
    first used (the first process group, or a dump): so _Watch._backends() calls it before it reads the
    recorder. A no-op for 1.x (no recorder) and torch >= 2.11."""
    torch = sys.modules.get("torch")
    if torch is None or os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE"):
        return
    try:
        major, minor = (int(x) for x in str(torch.__version__).split(".")[:2])
    except (AttributeError, ValueError):
        return
    if major == 2 and minor <= 10:
        os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"


def install():
    """Starts this process's record and its watch thread, once. Returns True when recording (under lspawn:
    LSPAWN_STATUS_DIR and RANK set), False otherwise. Call it before other threads start (they must
    inherit SIGURG blocked) and, for the collectives to be named, before init_process_group() is fine
    (the watch finds the groups as they appear)."""
    global _installed
    if _installed is not None and _installed.pid == os.getpid():
        return True
    # Another copy of this module (lspawn_hang and the wheel's lspawn.lspawn_hang) installed already.
    if getattr(sys, "_lspawn_hang_pid", None) == os.getpid():
        return True
    directory = os.environ.get("LSPAWN_STATUS_DIR", "")
    rank_text = os.environ.get("RANK", "")
    if not directory or not rank_text:
        return False
    try:
        rank = int(rank_text)
        if rank < 0:
            raise ValueError
    except ValueError:
        print("lspawn: hang diagnosis is off: RANK=%r is not a rank" % rank_text, file=sys.stderr, flush=True)
        return False
    try:
        record = _Record(directory, rank)
    except OSError as e:
        print("lspawn: rank %d: no status record (hang diagnosis is off for this rank): %s" % (rank, e),
              file=sys.stderr, flush=True)
        return False
    import faulthandler
    if not faulthandler.is_enabled():
        faulthandler.enable()
    current = signal.getsignal(STACK_SIGNAL)
    watch = _Watch(record, directory, rank)
    watch.pid = os.getpid()
    if current in (signal.SIG_DFL, None):  # a program's own SIGURG handler is left alone (no stacks)
        signal.pthread_sigmask(signal.SIG_BLOCK, [STACK_SIGNAL])
        record.set_stack_signal(STACK_SIGNAL)
        watch.answers_stacks = True
    _mark_phase(directory, rank, "started")

    def record_collectives():
        try:
            _mark_rendezvous_on_init(directory, rank)
        except Exception:  # the restart policy then treats this rank's failures as before
            pass
        if "torch" in sys.modules and not watch.backends:
            watch.backends = watch._backends()
        if not watch.backends:
            try:
                _Wrapped(record).install()
            except Exception as e:
                print("lspawn: rank %d: collectives not recorded (torch.distributed could not be wrapped: %s)"
                      % (rank, e), file=sys.stderr, flush=True)
    # Now if torch.distributed is imported, else when it is (a script that imports torch later, a worker that
    # never does), instead of importing torch here (~2 s per process, and an error where there is no torch).
    _when_imported("torch.distributed", record_collectives)
    watch.thread.start()
    # Run last of the script's atexit handlers (registered now, before the script's): the record keeps
    # following the script's own teardown (Lightning's destroy_process_group), then the thread is joined.
    atexit.register(watch.stop)
    _installed = watch
    sys._lspawn_hang_pid = os.getpid()
    return True


def installed():
    """Whether install() is recording in this process."""
    return _installed is not None and _installed.pid == os.getpid()


def _main(argv):
    """python -m lspawn_hang SCRIPT [ARGS...] | -m MODULE [ARGS...]: install(), then run it as __main__."""
    import runpy
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m lspawn_hang SCRIPT [ARGS...] | -m MODULE [ARGS...]\n"
              "Records this worker's collectives and answers lspawn's stack requests (docs/hang-diagnosis.md),\n"
              "then runs SCRIPT (or MODULE) as __main__.", file=sys.stderr)
        return 2 if not argv else 0
    import importlib
    # The module proper, not this __main__ copy (a script's own install() is then a no-op):
    # lspawn_hang, or lspawn.lspawn_hang when run from the wheel's package (python -m lspawn.lspawn_hang).
    spec = globals().get("__spec__")
    importlib.import_module(spec.name if spec is not None and spec.name != "__main__" else "lspawn_hang").install()
    if argv[0] == "-m":
        if len(argv) < 2:
            print("lspawn_hang: -m needs a module name", file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))


def claim_slot(name, group_rank, group_size):
    """Claims a slot of this rank's record for a group whose operations native code records itself (the
    torch.distributed backend `lspawn`: shm/engine.h's lspawn_status_enter/complete) and returns its address in
    this process, or 0 when nothing records here (install() was not called, or the slots ran out). The watch
    thread never writes that slot; the record stays mapped until the process ends."""
    if not installed():
        return 0
    record = _installed.record
    i = record.add_group(name, group_rank, group_size)
    if i is None:
        return 0
    import ctypes
    return ctypes.addressof(ctypes.c_char.from_buffer(record._map, _HEADER_BYTES + i * _SLOT_BYTES))


def install_cpu_backend(here):
    """`lspawn --cpu-backend lspawn` (LSPAWN_CPU_BACKEND=lspawn) in this worker: runs lspawn/distributed/_override.py,
    found beside `here` (the wheel's package folder, or a build tree's python/ folder) or in the lspawn package on the
    worker's own path. Never stops the script: a failure is said on stderr and its gloo groups stay gloo."""
    if os.environ.get("LSPAWN_CPU_BACKEND") != "lspawn":
        return
    try:
        import importlib.util
        places = [(os.path.join(here, "distributed", "_override.py"), os.path.dirname(here)),
                  (os.path.join(here, "lspawn", "distributed", "_override.py"), here)]
        found = importlib.util.find_spec("lspawn")
        if found is not None and found.submodule_search_locations:
            pkg = list(found.submodule_search_locations)[0]
            places.append((os.path.join(pkg, "distributed", "_override.py"), os.path.dirname(pkg)))
        for path, root in places:
            if os.path.isfile(path):
                spec = importlib.util.spec_from_file_location("_lspawn_override", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                module.install(root)
                return
        print("lspawn: --cpu-backend lspawn is off in this worker (no lspawn/distributed/_override.py beside %s)"
              % here, file=sys.stderr, flush=True)
    except Exception as e:
        print("lspawn: --cpu-backend lspawn is off in this worker (%s: %s)" % (type(e).__name__, e), file=sys.stderr,
              flush=True)
