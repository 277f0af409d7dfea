"""The guardian of this Python process: what spawn() started dies with it, even on SIGKILL.

One `lspawn-guardian` per parent process, started at the first spawn() (posix_spawn: no fork of
a possibly large interpreter), with one end of a socketpair on its fd 3; this process keeps the
other end (close-on-exec, and closed in forked children by an at-fork hook, so only this process
holds it). The protocol (supervisor/guardian_loop.hpp): native-endian int32 values, >0 registers
that process group, <0 unregisters it, 0 is a clean shutdown; INT32_MIN, a length and a path name
the directory to remove. When the socket reaches EOF without a 0 (this process died, whatever
killed it) the guardian SIGKILLs every registered group and removes that directory.

spawn() registers each group it starts (the launcher's, or each fork-mode child's) and
unregisters it once the group is empty. At interpreter exit the guardian is told to shut down
when nothing is registered; groups still registered then (a join=False context never joined)
are killed by closing the socket instead: nothing spawn() started outlives the interpreter.
"""
import atexit
import os
import shutil
import socket
import struct
import tempfile
import threading

from ._paths import guardian_binary

_OWNED_DIR = -(2 ** 31)  # guardian_loop.hpp's kOwnedDir

_lock = threading.Lock()
_guardian = None


class _Guardian:
    def __init__(self):
        program = guardian_binary()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fd = theirs.fileno()
        try:
            # dup2(fd, 3) clears close-on-exec only when fd != 3.
            moved = os.dup(fd) if fd == 3 else fd
            try:
                self.pid = os.posix_spawn(program, ["lspawn-guardian"], os.environ,
                                          file_actions=[(os.POSIX_SPAWN_DUP2, moved, 3)])
            finally:
                if moved != fd:
                    os.close(moved)
        except OSError as e:
            ours.close()
            raise OSError(e.errno, "lspawn: cannot start the guardian %s: %s" % (program, e.strerror)) from e
        finally:
            theirs.close()
        self.sock = ours
        self.owner = os.getpid()
        self.groups = set()
        self.dir = None

    def send(self, *values, tail=b""):
        self.sock.sendall(struct.pack("=%di" % len(values), *values) + tail)

    def close(self, clean):
        """Ends the guardian: a clean shutdown (nothing killed) or EOF (registered groups killed)."""
        try:
            if clean:
                self.send(0)
        except OSError:
            pass
        self.sock.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _get():
    global _guardian
    with _lock:
        if _guardian is None or _guardian.owner != os.getpid():
            _guardian = _Guardian()
        return _guardian


def register(pgid):
    """Makes the guardian SIGKILL process group `pgid` if this process dies."""
    g = _get()
    with _lock:
        g.send(pgid)
        g.groups.add(pgid)


def unregister(pgid):
    """Forgets `pgid` (call once the group is known empty)."""
    with _lock:
        g = _guardian
        if g is not None and g.owner == os.getpid() and pgid in g.groups:
            g.groups.discard(pgid)
            g.send(-pgid)


def private_dir():
    """This process's private directory, made once: every run directory and the warm daemon's socket
    live under it. The guardian removes it if this process dies (its one owned tree); at exit it is
    removed here. Starts the guardian."""
    g = _get()
    with _lock:
        if g.dir is None:
            g.dir = tempfile.mkdtemp(prefix="lspawn-py%d-" % os.getpid())
            data = os.fsencode(g.dir)
            g.send(_OWNED_DIR, len(data), tail=data)
        return g.dir


def _at_exit():
    global _guardian
    with _lock:
        g, _guardian = _guardian, None
    if g is not None and g.owner == os.getpid():
        clean = not g.groups
        g.close(clean=clean)
        if g.dir is not None and clean:
            shutil.rmtree(g.dir, ignore_errors=True)


def _after_fork_in_child():
    # A forked child must not hold the channel: the guardian would never see EOF while it lives,
    # and its own exit must not shut the parent's guardian down.
    global _guardian, _lock
    _lock = threading.Lock()
    g, _guardian = _guardian, None
    if g is not None:
        g.sock.close()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
