"""Builds the shim of the torch.distributed backend `lspawn` for the torch that is installed.

    python -m lspawn.distributed build [--out DIR]
    python path/to/lspawn/distributed/_build.py --torch-dir SITE/torch [--out DIR]   (no `import torch`)

The shim (_shim.cpp, beside this file) is one C++ file compiled against this torch's own headers
with the settings its extensions need, read from torch itself as torch.utils.cpp_extension reads
them: the C++ ABI flag (pip torch <= 2.6: _GLIBCXX_USE_CXX11_ABI=0, >= 2.7: 1; pytorch#143780) and
pybind11's compiler, standard library and ABI (PYBIND11_COMPILER_TYPE/STDLIB/BUILD_ABI: with other
values pybind11 does not recognise torch's c10d classes, pytorch#102832). It names no library of
torch's or lspawn's: their symbols (the engine's C symbols, shm/engine.h) resolve at load from the
torch the process imported and the liblspawn_engine.so that lspawn.distributed loads first.

Needs a C++ compiler ($CXX, else c++) and Python's headers (Debian: python3-dev). ~20-40 s.

With --torch-dir, the torch is an unpacked torch/ folder (a pip wheel's) that this Python need not be able to
import (another CUDA, no GPU libraries): its release comes from its version.py, the ABI flag from its
TorchConfig.cmake and pybind11's settings from the strings of its libtorch_python.so. That is how a shim is
built, or checked to compile, for a torch that cannot run here.
"""
import re
import os
import shlex
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildError(RuntimeError):
    pass


def torch_release(version):
    """'2.15.0+cu132' -> '2.15.0' (a CPU and a CUDA build of a release share c10d's ABI)."""
    return version.split("+", 1)[0]


class TorchInfo:
    """What a shim is built against: release, C++ ABI flag, pybind11 settings, include folders."""

    def __init__(self, version, cxx11_abi, pybind, includes):
        self.version, self.cxx11_abi, self.pybind, self.includes = version, cxx11_abi, pybind, includes

    @staticmethod
    def imported(includes=True):
        """The imported torch's. includes=False (naming the shim to load, not building one) leaves
        torch.utils.cpp_extension unimported: it costs ~120 ms, and a CUDA torch on a machine without CUDA
        prints "No CUDA runtime is found" when it is imported, on every rank (`includes` is then None)."""
        import torch
        pybind = {}
        for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
            value = getattr(torch._C, "_PYBIND11_" + name, None)
            if value is not None:
                pybind[name] = value
        paths = None
        if includes:
            import torch.utils.cpp_extension as ext
            paths = ext.include_paths()
        return TorchInfo(torch.__version__, int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)), pybind, paths)

    @staticmethod
    def from_dir(torch_dir):
        def read(rel, mode="r"):
            path = os.path.join(torch_dir, rel)
            try:
                with open(path, mode) as f:
                    return f.read()
            except OSError as e:
                raise BuildError("lspawn: --torch-dir %s: cannot read %s (%s): not a torch folder?" % (torch_dir, rel, e))
        m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", read("version.py"))
        abi = re.search(r"_GLIBCXX_USE_CXX11_ABI=([01])", read("share/cmake/Torch/TorchConfig.cmake"))
        if not m or not abi:
            raise BuildError("lspawn: --torch-dir %s: no __version__ in version.py or no _GLIBCXX_USE_CXX11_ABI in "
                             "TorchConfig.cmake" % torch_dir)
        lib = read("lib/libtorch_python.so", "rb")
        pybind = {}
        for name, pattern in (("COMPILER_TYPE", rb"\x00(_gcc|_clang|_icc)\x00"), ("STDLIB", rb"\x00(_libstdcpp|_libcpp)\x00"),
                              ("BUILD_ABI", rb"\x00(_cxxabi10\d\d)\x00")):
            hit = re.search(pattern, lib)
            if hit:
                pybind[name] = hit.group(1).decode()
        inc = os.path.join(torch_dir, "include")
        return TorchInfo(m.group(1), int(abi.group(1)), pybind, [inc, os.path.join(inc, "torch", "csrc", "api", "include")])


def shim_stem(info=None):
    """What a shim's file name says of its torch and Python, e.g.
    _lspawn_backend-torch2.15.0-cxx11abi1-cpython-311-x86_64-linux-gnu."""
    info = info or TorchInfo.imported(includes=False)
    return "_lspawn_backend-torch%s-cxx11abi%d-%s" % (torch_release(info.version), info.cxx11_abi, python_abi())


def shim_filename(info=None):
    """The file name the shim of this interpreter, torch and lspawn has: shim_stem() and source_digest(), e.g.
    _lspawn_backend-torch2.15.0-cxx11abi1-cpython-311-x86_64-linux-gnu-3f2a9c01b7de.so."""
    return "%s-%s.so" % (shim_stem(info), source_digest())


_digest = None


def source_digest():
    """12 hex digits of SHA-256 over what the shim is compiled from besides torch: _shim.cpp, _cuda_ipc.h, _cudart.h
    and the engine's header. In the shim's file name, so that a shim built from another lspawn's source is never loaded for this
    one: one built before an upgrade (~/.cache/lspawn/shims is looked in before the package's own), or by
    another environment's lspawn sharing the cache. Each finds its own."""
    global _digest
    if _digest is None:
        import hashlib
        h = hashlib.sha256()
        for path in (os.path.join(HERE, "_shim.cpp"), os.path.join(HERE, "_cuda_ipc.h"), os.path.join(HERE, "_cudart.h"),
                     os.path.join(_engine_header_dir(), "engine.h")):
            try:
                with open(path, "rb") as f:
                    h.update(f.read())
            except OSError as e:
                raise BuildError("lspawn: cannot read %s (%s): a damaged install? reinstall lspawn" % (path, e))
        _digest = h.hexdigest()[:12]
    return _digest


def python_abi():
    """This interpreter's extension ABI, as its extension modules are named (cpython-311-x86_64-linux-gnu)."""
    return sysconfig.get_config_var("SOABI") or "py%d%d" % sys.version_info[:2]


def default_out_dir():
    """Where a shim built on this machine goes unless --out says: $LSPAWN_BACKEND_SHIM_DIR, else
    $XDG_CACHE_HOME/lspawn/shims (~/.cache/lspawn/shims)."""
    env = os.environ.get("LSPAWN_BACKEND_SHIM_DIR")
    if env:
        return env
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "lspawn", "shims")


def _engine_header_dir():
    for d in (HERE, os.path.normpath(os.path.join(HERE, "..", "..", "..", "shm"))):
        if os.path.isfile(os.path.join(d, "engine.h")):
            return d
    raise BuildError("lspawn: engine.h is missing: looked in %s and the source tree's shm/ (a damaged install? "
                     "reinstall lspawn)" % HERE)


def commands(out_path, info=None):
    """The compiler's argvs for this torch: the compile (to out_path + ".o") and the link. Two steps, not
    one: a compiler cache (CXX="ccache c++") caches compiles only, never a compile-and-link."""
    info = info or TorchInfo.imported()
    major = int(torch_release(info.version).split(".")[0])
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    args = cxx + ["-c", "-fPIC", "-O2", "-g0", "-fvisibility=hidden",
                  "-std=c++20" if major >= 2 else "-std=c++17", "-w"]
    args.append("-D_GLIBCXX_USE_CXX11_ABI=%d" % info.cxx11_abi)
    for name, value in sorted(info.pybind.items()):
        args.append('-DPYBIND11_%s="%s"' % (name, value))
    args += ["-DLSPAWN_TORCH2=%d" % int(major >= 2), "-DTORCH_EXTENSION_NAME=_lspawn_backend",
             "-DTORCH_API_INCLUDE_EXTENSION_H"]
    for inc in info.includes + [sysconfig.get_paths()["include"]]:
        args += ["-isystem", inc]
    args += ["-I", _engine_header_dir()]
    obj = out_path + ".o"
    args += [os.path.join(HERE, "_shim.cpp"), "-o", obj]
    # No -lc10 -ltorch_cpu: the shim names no torch library (a wheel's shim would otherwise tie
    # auditwheel's tag to whatever libtorch the build machine has); its torch symbols resolve at
    # load from the torch the process imported, which lspawn.distributed puts in the global scope
    # first (_load()), as the engine's. The link runs the compiler itself, not the cache.
    linker = [a for a in cxx if os.path.basename(a) not in ("ccache", "sccache")] or ["c++"]
    return [args, linker + ["-shared", obj, "-o", out_path]]


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def build(out_dir=None, verbose=False, torch_dir=None):
    """Compiles the shim into out_dir (default_out_dir()) and returns its path. Raises BuildError
    with the compiler's output when it fails. torch_dir: an unpacked torch/ folder instead of `import torch`."""
    info = TorchInfo.from_dir(torch_dir) if torch_dir else TorchInfo.imported()
    out_dir = out_dir or default_out_dir()
    os.makedirs(out_dir, exist_ok=True)
    final = os.path.join(out_dir, shim_filename(info))
    tmp = "%s.tmp.%d" % (final, os.getpid())
    steps = commands(tmp, info)
    if not os.path.isfile(sysconfig.get_paths()["include"] + "/Python.h"):
        raise BuildError("lspawn: cannot build the backend's shim: Python's headers are missing (%s/Python.h; "
                         "Debian: apt-get install python3-dev)" % sysconfig.get_paths()["include"])
    try:
        for argv in steps:
            if verbose:
                print(" ".join(shlex.quote(a) for a in argv), file=sys.stderr)
            try:
                proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            except FileNotFoundError:
                raise BuildError("lspawn: cannot build the backend's shim: no C++ compiler %r (set CXX)" % argv[0]) from None
            if proc.returncode != 0:
                raise BuildError("lspawn: building the backend's shim failed (exit %d):\n%s\n%s" % (
                    proc.returncode, " ".join(shlex.quote(a) for a in argv), proc.stdout[-8000:]))
    except BuildError:
        _unlink(tmp)
        raise
    finally:
        _unlink(tmp + ".o")
    os.replace(tmp, final)
    return final


if __name__ == "__main__":  # python .../_build.py --torch-dir DIR [--out DIR] [-v]: no `import torch`
    import argparse
    parser = argparse.ArgumentParser(prog="_build.py")
    parser.add_argument("--torch-dir", required=True, help="an unpacked torch/ folder (a pip wheel's)")
    parser.add_argument("--out", help="folder for the shim (default: $LSPAWN_BACKEND_SHIM_DIR or ~/.cache/lspawn/shims)")
    parser.add_argument("-v", "--verbose", action="store_true")
    a = parser.parse_args()
    try:
        print(build(a.out, a.verbose, a.torch_dir))
    except BuildError as e:
        print(e, file=sys.stderr)
        sys.exit(1)
