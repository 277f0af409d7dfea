"""`lspawn --cpu-backend lspawn` inside a Python worker: an unmodified script's gloo runs on lspawn's backend.

Loaded by lspawn's sitecustomize (exec mode) and --preload's bootstrap when LSPAWN_CPU_BACKEND=lspawn. When the
script imports torch.distributed, this imports lspawn.distributed (which registers the backend) and wraps
init_process_group() and new_group() so that a backend naming gloo for CPU tensors names lspawn instead:

    "gloo"                  -> "cpu:lspawn,cuda:gloo"   (torch 1.13: "lspawn", which copies CUDA tensors through the host)
    "cpu:gloo,cuda:nccl"    -> "cpu:lspawn,cuda:nccl"
    None (torch 2.x's default, cpu:gloo + cuda:nccl) -> "cpu:lspawn,cuda:nccl" ("cpu:lspawn" without NCCL)

Anything else (nccl, mpi, another plugin) is left as it is. Nothing here may stop the script: a failure is said on
stderr once and the script runs on gloo.
"""
import os
import sys

ENV = "LSPAWN_CPU_BACKEND"


def rewrite(backend, torch_major, nccl_available):
    """The backend string to use instead of `backend` (the same when it does not involve gloo on CPU)."""
    if backend is None:
        if torch_major < 2:
            return None
        return "cpu:lspawn,cuda:nccl" if nccl_available else "cpu:lspawn"
    text = str(backend)
    low = text.lower()
    if low == "gloo":
        return "lspawn" if torch_major < 2 else "cpu:lspawn,cuda:gloo"
    if ":" in low:
        parts = []
        for item in low.split(","):
            device, _, name = item.partition(":")
            parts.append("%s:%s" % (device.strip(), "lspawn" if device.strip() == "cpu" and name.strip() == "gloo" else name.strip()))
        return ",".join(parts)
    return backend


def _apply(package_root):
    try:
        try:
            import lspawn.distributed  # noqa: F401  registers the backend
        except ImportError as e:
            if getattr(e, "name", None) not in ("lspawn", "lspawn.distributed"):
                raise
            sys.path.append(package_root)  # a build tree's python/ folder: last, the script's own modules first
            import lspawn.distributed  # noqa: F401
        import torch
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        major = int(torch.__version__.split(".")[0])
        nccl = bool(getattr(dist, "is_nccl_available", lambda: False)())

        def wrap(fn):
            if getattr(fn, "_lspawn_cpu_backend", False):
                return fn

            def wrapped(*args, **kwargs):
                if "backend" in kwargs:
                    kwargs["backend"] = rewrite(kwargs["backend"], major, nccl)
                elif fn.__name__ == "init_process_group" and args:
                    args = (rewrite(args[0], major, nccl),) + tuple(args[1:])
                elif fn.__name__ == "new_group" and len(args) >= 3:
                    args = tuple(args[:2]) + (rewrite(args[2], major, nccl),) + tuple(args[3:])
                elif fn.__name__ == "init_process_group":
                    kwargs["backend"] = rewrite(None, major, nccl)
                return fn(*args, **kwargs)

            wrapped.__name__ = fn.__name__
            wrapped.__qualname__ = getattr(fn, "__qualname__", fn.__name__)
            wrapped.__doc__ = fn.__doc__
            wrapped.__wrapped__ = fn
            wrapped._lspawn_cpu_backend = True
            return wrapped

        for name in ("init_process_group", "new_group"):
            original = getattr(c10d, name)
            w = wrap(original)
            setattr(c10d, name, w)
            if getattr(dist, name, None) is original:
                setattr(dist, name, w)
    except Exception as e:  # the script runs on gloo
        sys.stderr.write("lspawn: --cpu-backend lspawn is off in this worker (%s: %s); its gloo groups stay gloo\n"
                         % (type(e).__name__, e))


def install(package_root):
    """Applies the rewrite now if torch.distributed is imported, else when it is."""
    if os.environ.get(ENV) != "lspawn":
        return
    if "torch.distributed.distributed_c10d" in sys.modules:
        _apply(package_root)
        return
    hang = sys.modules.get("lspawn_hang")
    when = getattr(hang, "_when_imported", None)
    if when is None:
        sys.stderr.write("lspawn: --cpu-backend lspawn is off in this worker (lspawn_hang is not loaded)\n")
        return
    when("torch.distributed", lambda: _apply(package_root))
