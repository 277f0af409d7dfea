"""Where the installed lspawn's files are.

- `package_dir()`: this package's folder (the wheel's site-packages/lspawn/). The native launcher
  is told it through LSPAWN_HOME, and takes its helper files from there: libexec/lspawn-guardian,
  lib/liblspawn_preload.so, lspawn_preload.py (supervisor/install_layout.hpp).
- `lspawn_binary()`: the native `lspawn` program: $LSPAWN_BIN when set, else the `bin/lspawn` that
  the installed `lspawn` distribution recorded (pip puts it in the scripts folder of the prefix,
  not in the package), else `lspawn` on PATH.
- `guardian_binary()`: $LSPAWN_GUARDIAN when set, else the package's libexec/lspawn-guardian.

A file that is not there raises FileNotFoundError naming what was looked for and where.
"""
import importlib.metadata
import os
import shutil

_DAMAGED = "(a damaged install? reinstall lspawn)"


def package_dir():
    """The folder of the `lspawn` package."""
    return os.path.dirname(os.path.abspath(__file__))


def _executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _from_env(var, what):
    path = os.environ.get(var, "")
    if not path:
        return None
    if not _executable(path):
        raise FileNotFoundError("lspawn: %s is missing: $%s=%s is not an executable file" % (what, var, path))
    return os.path.abspath(path)


def _recorded_binary():
    """The `bin/lspawn` file of the installed distribution (its RECORD), or None."""
    try:
        files = importlib.metadata.distribution("lspawn").files or ()
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).replace(os.sep, "/").endswith("bin/lspawn"):
            path = os.path.normpath(str(f.locate()))
            if _executable(path):
                return path
    return None


def lspawn_binary():
    """The native `lspawn` launcher's path. Raises FileNotFoundError when there is none."""
    path = _from_env("LSPAWN_BIN", "the lspawn program")
    path = path or _recorded_binary() or shutil.which("lspawn")
    if path is None:
        raise FileNotFoundError(
            "lspawn: the lspawn program is missing: looked for $LSPAWN_BIN (unset), the bin/lspawn "
            "that the installed lspawn distribution records, and lspawn on PATH %s" % _DAMAGED)
    return path


def guardian_binary():
    """The `lspawn-guardian` program's path. Raises FileNotFoundError when it is not there."""
    path = _from_env("LSPAWN_GUARDIAN", "the guardian")
    if path:
        return path
    path = os.path.join(package_dir(), "libexec", "lspawn-guardian")
    if not _executable(path):
        raise FileNotFoundError("lspawn: the guardian is missing: looked for %s %s" % (path, _DAMAGED))
    return path
