#!/usr/bin/env bash
# Installs PyPI's LibTorch 2.x (the newest line lspawn builds against) into a virtual environment,
# idempotently, and prints the venv's path. Used by scripts/test.sh and for building by hand:
#   venv=$(bash scripts/setup-torch2.sh)
#   bash scripts/build.sh build-torch2 -DCMAKE_PREFIX_PATH="$venv/torch/share/cmake" -DLSPAWN_WITH_NCCL=ON
#
# What is downloaded, and why so little: the torch wheel alone (--no-deps, ~540 MB) carries the
# C++ LibTorch (headers, CMake config, libtorch_cpu/c10/torch_cuda). CUDA's libraries come from
# the machine's CUDA toolkit (/usr/local/cuda: cuBLAS, cuDNN, cuFFT, NVRTC, …), not from PyPI's
# nvidia-* wheels (~4 GB with every dependency); only what the toolkit lacks and libtorch_cuda.so
# needs to load is fetched: libcufile, libcusparseLt, libnvshmem_host, and the NCCL that torch was
# built against (the toolkit's NCCL, older, is what lspawn compiles against). Python's pure
# dependencies (sympy, jinja2, …) are installed too, for the interop tests (torchrun, scripts).
#
# Environment: LSPAWN_TORCH2_VENV (default: <repo>/.deps/torch2), LSPAWN_TORCH2_VERSION (2.15.0),
# PYTHON (default: python3).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${LSPAWN_TORCH2_VENV:-$root/.deps/torch2}
version=${LSPAWN_TORCH2_VERSION:-2.15.0}
py=${PYTHON:-python3}
# Versions that torch 2.15.0's wheel names in its Requires-Dist (pinned there too).
nvidia=(nvidia-cusparselt-cu13==0.8.1 nvidia-nvshmem-cu13==3.7.2 nvidia-nccl-cu13==2.30.7 nvidia-cufile)
pure=(filelock "typing-extensions>=4.13.0" sympy networkx jinja2 fsspec numpy)

stamp=$venv/.lspawn-torch2-$version
if [[ -f $stamp ]]; then
  echo "$venv"
  exit 0
fi
log() { echo "setup-torch2: $*" >&2; }
start=$SECONDS
"$py" -m venv "$venv" >&2
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
log "installing torch==$version (no CUDA dependencies) + ${#nvidia[@]} CUDA runtime wheels into $venv"
"${pip[@]}" install --no-deps --no-compile "torch==$version" "${nvidia[@]}" >&2
"${pip[@]}" install --no-compile "${pure[@]}" >&2
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# A stable path for CMake and the tests, whatever the Python version.
ln -sfn "$site/torch" "$venv/torch"
ln -sfn "$site/nvidia" "$venv/nvidia"
touch "$stamp"
log "done in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1))"
echo "$venv"
