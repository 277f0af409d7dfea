#!/usr/bin/env bash
# Installs PyPI's LibTorch VERSION for C++ use on the CPU alone, idempotently, and prints its torch/
# folder (for -DLSPAWN_TORCH_CPU_DIR=..., cmake/TorchCpuOnly.cmake). How CI gets the oldest 2.x
# of lspawn's supported range (docs/gpu.md#supported-libtorch):
#   dir=$(bash scripts/setup-torch-cpu.sh 2.4.1)
#   bash scripts/build.sh build-torch2.4 -DLSPAWN_TORCH_CPU_DIR="$dir"
#
# What is installed into <repo>/.deps/torch-VERSION (pip --target, no venv: nothing here imports
# torch in Python): the torch wheel with --no-deps, and only the CUDA runtime wheels that
# libtorch_cpu.so itself needs to load (2.4-2.6: libcudart and libcupti; none from 2.7), at the
# versions the wheel pins. Those are found through the wheel's own RPATH ($ORIGIN/../../nvidia/*).
# Not installed: cuBLAS, cuDNN, NCCL, ... (libtorch_cuda's, several GB), Python's dependencies.
# Python cannot `import torch` from this folder; the C++ build and its tests need nothing more.
#
# Environment: LSPAWN_TORCH_CPU_ROOT (default: <repo>/.deps), PIP (default: python3 -m pip).
set -euo pipefail
version=${1:?usage: setup-torch-cpu.sh VERSION (e.g. 2.4.1)}
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${LSPAWN_TORCH_CPU_ROOT:-$root/.deps}/torch-$version
stamp=$dest/.lspawn-torch-cpu-$version
if [[ -f $stamp ]]; then
  echo "$dest/torch"
  exit 0
fi
log() { echo "setup-torch-cpu: $*" >&2; }
read -r -a pip <<<"${PIP:-python3 -m pip}"
pip+=(--disable-pip-version-check -q)
start=$SECONDS
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "downloading torch==$version (the wheel alone)"
"${pip[@]}" download --no-deps --only-binary=:all: -d "$tmp" "torch==$version" >&2
wheel=$(ls "$tmp"/torch-*.whl)
rm -rf "$dest"
mkdir -p "$dest"
log "installing $(basename "$wheel") into $dest"
"${pip[@]}" install --no-deps --no-compile --target "$dest" "$wheel" >&2
# The CUDA runtime libraries libtorch_cpu.so loads (2.4-2.6), from the wheels the torch wheel pins
# (Requires-Dist: "nvidia-cuda-runtime-cu12 (==12.1.105) ; ...").
needed=$(ldd "$dest/torch/lib/libtorch_cpu.so" | grep -oE 'lib(cudart|cupti)\.so\.[0-9]+ => not found' | cut -d' ' -f1 || true)
if [[ -n $needed ]]; then
  meta=$(unzip -p "$wheel" '*.dist-info/METADATA')
  runtime=()
  for lib in cuda-runtime cuda-cupti; do
    req=$(grep -E "^Requires-Dist: nvidia-$lib-cu[0-9]+" <<<"$meta" | head -1 | sed -E 's/^Requires-Dist: //; s/ *;.*//; s/[ ()]//g') || true
    [[ -n $req ]] && runtime+=("$req")
  done
  if ((${#runtime[@]} == 0)); then
    log "torch $version's libtorch_cpu.so needs $(echo $needed) but its METADATA pins no nvidia-cuda-runtime/cupti wheel"
    exit 1
  fi
  log "libtorch_cpu.so needs $(echo $needed): installing ${runtime[*]}"
  "${pip[@]}" install --no-deps --no-compile --target "$dest" "${runtime[@]}" >&2
fi
# What the C++ build must find, checked now rather than at link time.
for f in include/torch/csrc/api/include/torch/version.h lib/libtorch_cpu.so lib/libc10.so; do
  [[ -e $dest/torch/$f ]] || { log "$dest/torch/$f is missing after the install"; exit 1; }
done
if missing=$(ldd "$dest/torch/lib/libtorch_cpu.so" | grep 'not found'); then
  log "libtorch_cpu.so of torch $version cannot load: $missing"
  exit 1
fi
touch "$stamp"
log "done in $((SECONDS - start)) s ($(du -sh "$dest" | cut -f1))"
echo "$dest/torch"
