"""torch.multiprocessing's face on `import lspawn as mp`, and lspawn.install() for code that calls torch's.

The re-exports: everything torch.multiprocessing exports beyond spawn (multiprocessing's whole
`__all__`: get_context, set_start_method, Queue, SimpleQueue, Pipe, Process, Manager, Pool, Lock,
Event, ..., and set_sharing_strategy, get_sharing_strategy, get_all_sharing_strategies) is taken,
at its first use, from torch.multiprocessing when torch is importable (so tensors put in its
queues share memory, and the sharing strategy is torch's own), else from multiprocessing (the
sharing functions then say "file_descriptor", the only strategy without torch, and refuse
another). `import lspawn` itself imports neither: a module `__getattr__` resolves them.

install() makes torch.multiprocessing.spawn / start_processes (the package's names and those of
torch.multiprocessing.spawn, where `from torch.multiprocessing.spawn import start_processes`
finds them) lspawn's, for code that calls torch's itself (Lightning's ddp_spawn launcher), and
torch.distributed.launcher.api.elastic_launch for a function on one node (accelerate's
notebook_launcher): with keyword defaults for lspawn's extra options, e.g.
`lspawn.install(preload=["torch"])`. uninstall() puts torch's back.
"""
import importlib.util
import multiprocessing
import sys

SHARING = ("set_sharing_strategy", "get_sharing_strategy", "get_all_sharing_strategies")
NAMES = tuple(multiprocessing.__all__) + SHARING


def _torch_mp():
    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        try:
            import torch.multiprocessing
            return torch.multiprocessing
        except ImportError:
            pass
    return None


class _NoTorchSharing:
    """The sharing-strategy functions without torch: nothing to share but what multiprocessing pickles."""

    strategy = "file_descriptor"

    @staticmethod
    def get_all_sharing_strategies():
        return {"file_descriptor"}

    @classmethod
    def get_sharing_strategy(cls):
        return cls.strategy

    @staticmethod
    def set_sharing_strategy(new_strategy):
        if new_strategy != "file_descriptor":
            raise ValueError("lspawn: set_sharing_strategy(%r): without torch the only strategy is "
                             "'file_descriptor'" % (new_strategy,))


def resolve(name):
    """The object `lspawn.<name>` stands for (see the module's doc)."""
    tmp = _torch_mp()
    if tmp is not None and hasattr(tmp, name):
        return getattr(tmp, name)
    if name in SHARING:
        return getattr(_NoTorchSharing, name)
    return getattr(multiprocessing, name)


_saved = None


def install(**defaults):
    """Makes torch.multiprocessing.spawn / start_processes run through lspawn (see the module's doc).

    `defaults` are lspawn's keyword options (preload, torchrun_env, grace_period, hang_timeout, warm,
    daemon_socket) applied to every call that does not give them. Idempotent: a second call
    replaces the defaults. Imports torch.multiprocessing."""
    global _saved
    from . import _spawn
    import inspect
    allowed = [p.name for p in inspect.signature(_spawn.start_processes).parameters.values()
               if p.kind is p.KEYWORD_ONLY]
    for k in defaults:
        if k not in allowed:
            raise TypeError("lspawn.install: unknown option %r (lspawn's options: %s)" % (k, ", ".join(allowed)))
    import torch.multiprocessing as tmp
    module = sys.modules["torch.multiprocessing.spawn"]
    if _saved is None:
        _saved = {(tmp, "spawn"): tmp.spawn, (tmp, "start_processes"): tmp.start_processes,
                  (module, "spawn"): module.spawn, (module, "start_processes"): module.start_processes}

    def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn", **options):
        return _spawn.start_processes(fn, args, nprocs, join, daemon, start_method, **dict(defaults, **options))

    def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn", **options):
        return _spawn.spawn(fn, args, nprocs, join, daemon, start_method, **dict(defaults, **options))

    for f, doc in ((start_processes, _spawn.start_processes.__doc__), (spawn, _spawn.spawn.__doc__)):
        f.__doc__ = doc
        f.__module__ = "lspawn"
        f._lspawn = True
    for owner in (tmp, module):
        owner.spawn = spawn
        owner.start_processes = start_processes
    _install_elastic_launch(defaults)


def _elastic_worker(i, entrypoint, args):
    return entrypoint(*args)


def _install_elastic_launch(defaults):
    """torch.distributed.launcher.api.elastic_launch (torchrun's agent, in-process; accelerate's
    notebook_launcher launches with it) for a function on one node: lspawn's processes instead of the
    agent's, with torchrun's variables (a reserved MASTER_PORT), the config's start method, and its
    return value: {local rank: what the function returned}. A failure raises lspawn's exception (torch's
    ProcessRaisedException / ProcessExitedException) instead of the agent's ChildFailedError. A command
    entrypoint, several nodes or restarts stay with torch's agent."""
    try:
        import torch.distributed.launcher.api as api
    except ImportError:  # a torch without torch.distributed
        return
    from . import _spawn
    original = _saved.setdefault((api, "elastic_launch"), api.elastic_launch)

    class elastic_launch:  # noqa: N801 (torch's name)
        def __init__(self, config, entrypoint, *rest, **kw):
            self._config, self._entrypoint = config, entrypoint
            self._torch = original(config, entrypoint, *rest, **kw)

        def __call__(self, *args):
            c = self._config
            if not callable(self._entrypoint) or c.max_nodes != 1 or c.min_nodes != 1 or c.max_restarts:
                return self._torch(*args)
            method = c.start_method if c.start_method in _spawn.START_METHODS else "spawn"
            options = dict(defaults, torchrun_env=True)
            if method == "fork":  # the launcher's options have no meaning for forked processes
                for k in ("preload", "hang_timeout", "daemon_socket", "warm"):
                    options.pop(k, None)
            values = _spawn.start_processes(_elastic_worker, (self._entrypoint, args), c.nproc_per_node,
                                            start_method=method, **options)
            return dict(enumerate(values))

    elastic_launch._lspawn = True
    api.elastic_launch = elastic_launch


def uninstall():
    """Puts torch's spawn / start_processes back (nothing to do when install() was not called)."""
    global _saved
    if _saved is None:
        return
    for (owner, name), value in _saved.items():
        setattr(owner, name, value)
    _saved = None


def installed():
    """Whether torch.multiprocessing.start_processes is lspawn's now."""
    tmp = sys.modules.get("torch.multiprocessing")
    return tmp is not None and getattr(getattr(tmp, "start_processes", None), "_lspawn", False)
