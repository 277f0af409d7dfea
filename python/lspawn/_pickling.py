"""How fn and args reach a process that is not a fork of the parent (spawn, forkserver, preload).

What multiprocessing's spawn does for its Process, done here for each rank of a launcher run:

- **Shared objects.** fn and args are pickled with multiprocessing's ForkingPickler, once per rank, as if
  a multiprocessing Process were being started: queues, pipes, locks, events and conditions of
  `get_context("spawn")` (or "forkserver") pickle (their `assert_spawning` passes), and every
  file descriptor they carry (a pipe's end, a queue's reader) is handed over by multiprocessing's
  resource sharer: a thread of this process that passes it to the rank over a Unix socket
  (SCM_RIGHTS), guarded by this process's authkey, which the rank takes from the preparation
  data. With torch imported, torch's reductions apply as in torch.multiprocessing: a CPU tensor
  is moved to shared memory and the rank maps the same pages (the parent sees its writes), a CUDA
  tensor travels as a CUDA IPC handle. Each fd can be fetched once, hence one pickle per rank.
- **Functions a new interpreter cannot import** (a lambda, a closure, one defined in a notebook
  or an interactive `__main__`): pickled by value with cloudpickle when it is installed (the
  `notebook` extra, `pip install lspawn[notebook]`); without it, a TypeError names the extra.
  cloudpickle keeps multiprocessing's and torch's reductions (its pickler is given the
  ForkingPickler's table), so a lambda and a shared queue can travel together.

What cannot travel is said before any process starts: a TypeError naming fn or args, the start
method and the cause (a lock of a fork context, say: multiprocessing's own message).
"""
import copyreg
import io
import os
import pickle
import sys
from collections import ChainMap
from multiprocessing import context as _mp_context
from multiprocessing import reduction as _reduction

NOTEBOOK_EXTRA = "pip install 'lspawn[notebook]' (or cloudpickle)"


class _Sharing:
    """Stands in for a starting multiprocessing Popen while args are pickled: every fd goes
    through the resource sharer, which any process with this process's authkey can fetch from."""

    def __init__(self):
        self.ids = []  # the resource sharer's keys of the fds this run handed out

    def duplicate_for_child(self, fd):
        return fd

    def DupFd(self, fd):  # noqa: N802 (multiprocessing's name)
        from multiprocessing import resource_sharer
        df = resource_sharer.DupFd(fd)
        self.ids.append(df._id)
        return df

    def forget(self):
        """Closes the fds no rank fetched (a rank that died before it unpickled its args)."""
        from multiprocessing import resource_sharer
        sharer = resource_sharer._resource_sharer
        for _, key in self.ids:
            with sharer._lock:
                entry = sharer._cache.pop(key, None)
            if entry is not None:
                entry[1]()
        self.ids = []


def main_without_file():
    """Whether `__main__` is a notebook, an interactive session, `python -c` or `python -` (its
    `__file__` "<stdin>"): a new process cannot import what is defined there."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return not (path and os.path.isfile(path)) and getattr(getattr(main, "__spec__", None), "name", None) is None


def _by_reference_fails(fn):
    """Whether fn is pickled by reference to a place a new interpreter cannot import."""
    name = getattr(fn, "__qualname__", "")
    return getattr(fn, "__module__", None) == "__main__" and main_without_file() or "<lambda>" in name \
        or "<locals>" in name


def _cloudpickle():
    try:
        import cloudpickle
    except ImportError:
        return None
    return cloudpickle


_cloud_pickler = None


def _cloud_pickler_class(cloud):
    """cloudpickle's pickler with multiprocessing's and torch's reductions (ForkingPickler's table, read live:
    torch registers its own when torch.multiprocessing is imported) before its own. A class attribute: the C
    pickler reads dispatch_table once, in __init__, and CloudPickler's class attribute shadows the slot an
    assignment on the instance would fill (such an assignment was lost: a notebook's tensor travelled as a
    copy, a pipe's end as a bare fd number)."""
    global _cloud_pickler
    if _cloud_pickler is None:
        class _CloudPickler(cloud.CloudPickler):
            dispatch_table = ChainMap(_reduction.ForkingPickler._extra_reducers,
                                      getattr(cloud.CloudPickler, "dispatch_table", copyreg.dispatch_table))
        _cloud_pickler = _CloudPickler
    return _cloud_pickler


def _dump(obj, cloud):
    buf = io.BytesIO()
    if cloud is None:
        _reduction.ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    else:
        _cloud_pickler_class(cloud)(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _torch_reductions():
    """torch's reductions, registered with ForkingPickler by importing torch.multiprocessing: only
    when the parent imported torch (a tensor in args means it did); never imports torch itself."""
    if "torch" in sys.modules:
        import torch.multiprocessing  # noqa: F401


def dumps_for_ranks(fn, args, nprocs, start_method):
    """([fn pickle], [args pickle] of rank 0..nprocs-1, _Sharing). Raises TypeError naming what failed."""
    _torch_reductions()
    # By value (cloudpickle) when fn cannot travel by reference, and in a notebook or interactive
    # session, where args may hold objects of its __main__ too; by reference otherwise.
    cloud = _cloudpickle() if main_without_file() or _by_reference_fails(fn) else None
    if cloud is None and _by_reference_fails(fn):
        raise TypeError("lspawn.spawn: fn %r is defined where a new process cannot import it (a lambda, a "
                        "closure, a notebook or an interactive __main__), which start_method=%r needs: %s to "
                        "send it by value, define it in a module, or use start_method='fork'"
                        % (fn, start_method, NOTEBOOK_EXTRA))
    sharing = _Sharing()
    previous = _mp_context.get_spawning_popen()
    _mp_context.set_spawning_popen(sharing)
    try:
        out = []
        # fn too, once per rank: a bound method (Lightning's launcher) carries tensors and queues as args do.
        for name, value, copies in (("fn", fn, nprocs), ("args", args, nprocs)):
            try:
                out.append([_dump(value, cloud) for _ in range(copies)])
                continue
            except RuntimeError as e:  # multiprocessing's refusals (a fork context's lock): no retry helps
                error = e
            except Exception as e:
                error = e
                if cloud is None and _cloudpickle() is not None:
                    cloud = _cloudpickle()  # a lambda or a local class inside args, say
                    try:
                        out.append([_dump(value, cloud) for _ in range(copies)])
                        continue
                    except Exception as e2:
                        error = e2
            hint = "" if cloud is not None or _cloudpickle() is not None else \
                " (a lambda or a function of a notebook travels by value with cloudpickle: %s)" % NOTEBOOK_EXTRA
            raise TypeError("lspawn.spawn: %s cannot be pickled, as start_method=%r needs%s; start_method='fork' "
                            "takes any: %s: %s" % (name, start_method, hint, type(error).__name__, error)) from error
    except BaseException:
        sharing.forget()
        raise
    finally:
        _mp_context.set_spawning_popen(previous)
    return out[0], out[1], sharing


def dumps_result(value):
    """A rank's return value for the parent: a plain copy (the rank is gone when the parent reads it)."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

