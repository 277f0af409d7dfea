"""The torch.distributed backend `lspawn`: lspawn's shared-memory collectives under torch.distributed.

    import lspawn.distributed            # registers the backend (importing it twice is harmless)
    dist.init_process_group("cpu:lspawn,cuda:nccl")     # torch 2.x; torch 1.13: "lspawn"

Every collective on CPU tensors of ranks that share one host runs on lspawn's engine (the
shared-memory communicator of the C++ runtime, liblspawn_engine.so). In a group spanning hosts the
reductions, broadcast, the all_gathers and barrier run on it within each host and on gloo between the
hosts' leaders. Point-to-point work, the other ops of such a group and what the engine does not reduce
(complex numbers, int16, ...) go to a gloo backend of the same group, so results are gloo's wherever
lspawn's are not. CUDA tensors (init_process_group("lspawn") on torch 2.x) go device to device through
CUDA IPC within a host from LSPAWN_SHM_CUDA_IPC_MIN_BYTES (2 MiB) on, staged through host memory below it
(cuda_ipc() says which). A rank that dies mid-collective makes the others fail within milliseconds with an
error naming it. Under lspawn the backend's operations enter the rank's status record (`lspawn status`,
`--hang-timeout`).
docs/python-backend.md has the whole story.

The backend is compiled per torch release (a shim, built against that release's c10d); the one
for the installed torch is picked at the first init_process_group/new_group by torch's version, its
C++ ABI and this Python. A torch without one gets an error there naming the command that builds it:
`python -m lspawn.distributed build`. Importing this module imports torch; `import lspawn` and
`lspawn.spawn()` do not.
"""
import ctypes
import glob
import importlib.machinery
import importlib.util
import os
import sys

import torch
import torch.distributed as dist

from . import _build

__all__ = ["BACKEND", "register", "ShimMissingError", "transport", "counts", "cuda_ipc", "supported_releases",
           "supports_abort"]

BACKEND = "lspawn"
_HERE = os.path.dirname(os.path.abspath(__file__))
_shim = None


class ShimMissingError(ImportError):
    """No build of the backend matches the installed torch (or this Python)."""


def _shim_dirs():
    dirs = []
    if os.environ.get("LSPAWN_BACKEND_SHIM_DIR"):
        dirs.append(os.environ["LSPAWN_BACKEND_SHIM_DIR"])
    dirs.append(_build.default_out_dir())
    dirs.append(os.path.join(_HERE, "_shims"))
    seen = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return seen


def supported_releases():
    """The torch releases (and Pythons) this install has a shim for, as 'torch 2.15.0 (cpython-311...)'. Shims
    built from another lspawn's source (_build.source_digest()) are not counted: they are never loaded."""
    out = []
    suffix = "-%s.so" % _build.source_digest()
    for d in _shim_dirs():
        for path in sorted(glob.glob(os.path.join(d, "_lspawn_backend-torch*" + suffix))):
            name = os.path.basename(path)[len("_lspawn_backend-torch"):-len(suffix)]
            release, abi, soabi = name.split("-", 2)
            out.append("torch %s (%s, %s)" % (release, abi.replace("cxx11abi", "CXX11 ABI "), soabi))
    return out


def _engine_path():
    env = os.environ.get("LSPAWN_ENGINE")
    candidates = [env] if env else []
    candidates.append(os.path.join(os.path.dirname(_HERE), "lib", "liblspawn_engine.so"))
    for c in candidates:
        if c and os.path.isfile(c):
            return c
    raise ShimMissingError("lspawn: the backend's engine is missing: looked for %s (a damaged install? reinstall "
                           "lspawn; in a build tree set LSPAWN_ENGINE=<build>/shm/liblspawn_engine.so)"
                           % " and ".join(c for c in candidates if c))


_TORCH_LIBS = ("libc10.so", "libtorch_cpu.so", "libtorch_python.so", "libtorch.so")


def _torch_symbols_global():
    """Puts the torch libraries this process loaded (import torch: local to torch._C) in the global scope, so
    that the shim, which names none of them (_build.py), resolves its c10/c10d symbols from this very torch."""
    with open("/proc/self/maps") as f:
        paths = {line.split(None, 5)[5].strip() for line in f if line.count(" ") >= 5 and "/" in line}
    for path in sorted(paths):
        if os.path.basename(path).startswith(_TORCH_LIBS) and os.path.isfile(path):
            ctypes.CDLL(path, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)


def _load():
    global _shim
    if _shim is not None:
        return _shim
    ctypes.CDLL(_engine_path(), mode=ctypes.RTLD_GLOBAL)  # the shim's engine_* symbols
    _torch_symbols_global()
    info = _build.TorchInfo.imported(includes=False)
    name = _build.shim_filename(info)
    for d in _shim_dirs():
        path = os.path.join(d, name)
        if os.path.isfile(path):
            loader = importlib.machinery.ExtensionFileLoader("lspawn.distributed._lspawn_backend", path)
            spec = importlib.util.spec_from_file_location("lspawn.distributed._lspawn_backend", path, loader=loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            if module.engine_abi() != module.ENGINE_ABI:
                raise ShimMissingError("lspawn: %s was built for engine ABI %d, the engine is %d: rebuild it with "
                                       "`%s -m lspawn.distributed build`" % (path, module.ENGINE_ABI,
                                                                             module.engine_abi(), sys.executable))
            _shim = module
            return module
    have = supported_releases()
    stem = _build.shim_stem(info)
    stale = sorted(p for d in _shim_dirs() for p in glob.glob(os.path.join(glob.escape(d), glob.escape(stem) + "*.so")))
    raise ShimMissingError(
        "lspawn: the torch.distributed backend 'lspawn' has no build for torch %s (C++ ABI %d, %s): this install "
        "has %s.%s Build one against the installed torch (needs a C++ compiler and Python's headers, ~30 s):\n"
        "    %s -m lspawn.distributed build\n(looked for %s in %s)" % (
            info.version, info.cxx11_abi, _build.python_abi(), ", ".join(have) if have else "none",
            (" Not loaded, built from another lspawn's source (before an upgrade, or another environment's): %s."
             % ", ".join(stale)) if stale else "",
            sys.executable, name, ", ".join(_shim_dirs())))


def _claim_status_slot(name, group_rank, group_size):
    """A slot of this rank's status record for the group (lspawn_hang, when it records here), or 0."""
    for module_name in ("lspawn_hang", "lspawn.lspawn_hang"):
        hang = sys.modules.get(module_name)
        if hang is not None and getattr(hang, "installed", lambda: False)() and hasattr(hang, "claim_slot"):
            return hang.claim_slot(name, group_rank, group_size)
    return 0


def _use_engine():
    value = os.environ.get("LSPAWN_BACKEND_SHM", "1")
    if value not in ("0", "1"):
        raise ValueError("lspawn: LSPAWN_BACKEND_SHM=%r: expected 1 (shared memory within a host, the default) or 0 "
                         "(every operation through gloo)" % value)
    return value == "1"


def _host_key():
    """Three numbers equal on two ranks exactly when they share shared memory: this boot (boot_id) and this
    /dev/shm (device, inode; a container has its own). LSPAWN_BACKEND_HOST_KEY=<text> replaces them (tests:
    hosts simulated on one machine; docs/python-backend.md)."""
    import hashlib
    override = os.environ.get("LSPAWN_BACKEND_HOST_KEY")
    if override:
        return [int(hashlib.sha1(override.encode()).hexdigest()[:15], 16), 0, 0]
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = int(hashlib.sha1(f.read().strip().encode()).hexdigest()[:15], 16)
    st = os.stat("/dev/shm")
    return [boot, int(st.st_dev) & (2 ** 62 - 1), int(st.st_ino) & (2 ** 62 - 1)]


def _hosts(fallback, size):
    """Every rank's host key, through the group's gloo (one all_gather of 3 numbers)."""
    mine = torch.tensor(_host_key(), dtype=torch.int64)
    outs = [torch.empty(3, dtype=torch.int64) for _ in range(size)]
    fallback.allgather([outs], [mine]).wait()
    return [tuple(t.tolist()) for t in outs]


def _gloo(store, rank, size, timeout, prefix="lspawn-gloo/"):
    """A gloo backend over the group's store: the group's (point to point, other hosts, the rest), or the hosts'
    leaders'."""
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, timeout)


def _generation_store(store, size):
    """The group's store under lspawn/<generation>/, where every key lspawn writes for this group lives: gloo's
    addresses (its backends'), the shared-memory segment's name, the first-failure note. The generation counts
    the times a group of this name was made on this store: torch names groups again from 0 after
    destroy_process_group() (so that recovering trainers agree), and the keys of the last one were read as this
    one's: its gloo rendezvous connected to the old addresses and timed out. Every rank adds 1 once; no rank
    can make the next generation before every rank added to this one (its rendezvous needs them all)."""
    generation = (int(store.add("lspawn/generations", 1)) - 1) // max(size, 1)
    return dist.PrefixStore("lspawn/%d/" % generation, store)


def _create(opts, backend_options=None):
    """Backend.register_backend's creator (extended API): torch 1.13 and 2.x."""
    shim = _load()
    rank, size, timeout = opts.group_rank, opts.group_size, opts.timeout
    ranks = list(getattr(opts, "global_ranks_in_group", None) or range(size))
    group_id = str(getattr(opts, "group_id", "") or "0")
    # Every setting read before the first rendezvous: a rank that fails on a bad value fails on its own reading,
    # not on its gloo peer that left for the same reason ("Connection closed by peer").
    use_engine = _use_engine()
    shim.check_settings()
    store = _generation_store(opts.store, size)
    fallback = _gloo(store, rank, size, timeout)
    rank_hosts, leaders = [], None
    if use_engine:
        keys = _hosts(fallback, size)
        order = []  # hosts in the order of their lowest rank
        for k in keys:
            if k not in order:
                order.append(k)
        rank_hosts = [order.index(k) for k in keys]
        if len(order) > 1:
            heads = [keys.index(k) for k in order]  # each host's lowest rank: its leader
            if rank in heads:
                leaders = _gloo(store, heads.index(rank), len(heads), timeout, "lspawn-leaders/")
    label = "world" if group_id in ("0", "default_pg") else "pg" + group_id
    slot = _claim_status_slot("lspawn:" + label, rank, size)
    return shim.create(store, rank, size, int(timeout.total_seconds() * 1000), [int(r) for r in ranks], group_id,
                       fallback, int(slot), rank_hosts, leaders)


def _backends_of(group):
    """The group's process group and its CPU backend (torch 2.x), of which one may be lspawn's."""
    pg = group or dist.distributed_c10d._get_default_group()
    candidates = [pg]
    get_backend = getattr(pg, "_get_backend", None)
    if get_backend is not None:
        try:
            candidates.append(get_backend(torch.device("cpu")))
        except RuntimeError:
            pass
    return candidates


def _ours(group):
    """The group's lspawn backend (as torch hands it out) and its transport, or (None, None)."""
    if _shim is None:  # no lspawn backend was made in this process
        return None, None
    for c in _backends_of(group):
        how = _shim.transport(c)
        if how is not None:
            return c, how
    return None, None


def transport(group=None):
    """'shm' when the group's collectives run on lspawn's engine, 'shm+gloo' when the group spans hosts
    (reductions, broadcast, the all_gathers and barrier on the engine within each host, gloo between
    them), 'gloo' when they all go to gloo (LSPAWN_BACKEND_SHM=0); None when the group has no lspawn backend."""
    return _ours(group)[1]


def counts(group=None):
    """How many ops of the group ran on lspawn's path and how many were handed to gloo whole, by op name:
    {"lspawn": {"all_reduce": 120, ...}, "gloo": {"send": 2, ...}, "cuda_ipc": {"all_reduce": 40, ...}};
    None when the group has no lspawn backend. What goes to gloo: point to point, what the engine cannot
    reduce (complex, int16, ...), sparse tensors, and across hosts gather, scatter and all_to_all
    (docs/python-backend.md). "cuda_ipc": of lspawn's, those whose CUDA tensors went device to device."""
    backend, _ = _ours(group)
    return _shim.counts(backend) if backend is not None else None


def supports_abort():
    """True when torch's ProcessGroup.abort() (distributed_c10d._abort_process_group()) reaches this backend:
    torch 2.7 and later, whose Backend class has abort(). Elsewhere it does nothing here, as on gloo."""
    return bool(_load().ABORT)


def cuda_ipc(group=None):
    """The group's CUDA IPC path: "on" (it carried an op), "off: <why>" (a rank could not export or map its
    device memory: CUDA tensors are staged through host memory from then on), "unused" (no CUDA tensor of
    LSPAWN_SHM_CUDA_IPC_MIN_BYTES or more yet, LSPAWN_SHM_CUDA_IPC=0, or the group spans hosts); None when
    the group has no lspawn backend."""
    backend, _ = _ours(group)
    return _shim.cuda_ipc(backend) if backend is not None else None


def register():
    """Registers the backend `lspawn` with torch.distributed, once (a second call does nothing)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    try:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
    except TypeError:  # torch 1.13: no `devices`
        dist.Backend.register_backend(BACKEND, _create, extended_api=True)


register()
