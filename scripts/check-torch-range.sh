#!/usr/bin/env bash
# Compiles (g++ -fsyntax-only) every source of lspawn that includes LibTorch against the headers of
# each PyPI torch 2.x release given, to check the whole supported range between the two that CI
# builds and tests in full (2.4.1 and 2.15.0; docs/gpu.md#supported-libtorch). The NCCL sources
# (runtime/, collectives/ with LSPAWN_HAVE_NCCL) are read with the NCCL definitions on, against the
# CUDA toolkit's headers, as a CUDA LibTorch build reads them.
#
#   bash scripts/check-torch-range.sh                     # every 2.x minor from 2.4 to 2.15
#   bash scripts/check-torch-range.sh 2.11.0 2.12.1       # those
#
# Headers come from each version's wheel (pip download, ~0.8 GB each, only torch/include kept) in
# LSPAWN_TORCH_HEADERS (default: <repo>/.deps/torch-headers/VERSION). Prints one line per version
# and source; exits 1 if any failed (their first errors are printed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${LSPAWN_TORCH_HEADERS:-$root/.deps/torch-headers}
versions=("$@")
((${#versions[@]})) || versions=(2.4.1 2.5.1 2.6.0 2.7.1 2.8.0 2.9.1 2.10.0 2.11.0 2.12.1 2.13.0 2.14.1 2.15.0)
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
jobs=${LSPAWN_JOBS:-$(nproc)}

headers() {  # $1: version → prints the include folder, downloading it once
  local v=$1 dir=$cache/$1
  if [[ ! -f $dir/.complete ]]; then
    local tmp
    tmp=$(mktemp -d)
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp" "torch==$v" >&2
    rm -rf "$dir" && mkdir -p "$dir"
    unzip -q -o "$tmp"/torch-*.whl 'torch/include/*' -d "$dir"
    rm -rf "$tmp"
    touch "$dir/.complete"
  fi
  echo "$dir/torch/include"
}

# Every source that reads LibTorch: the torch parts (runtime/ and above, docs/architecture.md), and
# the examples.
mapfile -t sources < <(cd "$root" && ls runtime/*.cpp runtime/spawn/*.cpp collectives/*.cpp strategies/*.cpp examples/*.cpp)
nccl_sources=(runtime/process_group.cpp collectives/group.cpp)

failed=0
for v in "${versions[@]}"; do
  inc=$(headers "$v")
  start=$SECONDS
  log=$(mktemp -d)
  # The heavy headers once per release, precompiled (~20 s): each source then takes ~2 s instead
  # of ~10. The NCCL sources are read without it (other definitions).
  flags=(-std=c++20 -w -I"$root" -isystem "$inc" -isystem "$inc/torch/csrc/api/include"
         -DUSE_DISTRIBUTED -DUSE_C10D_GLOO -DUSE_RPC -DUSE_TENSORPIPE)
  printf '%s\n' '#include <torch/torch.h>' '#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>' \
    '#include <torch/csrc/distributed/c10d/TCPStore.hpp>' '#include <torch/csrc/distributed/c10d/PrefixStore.hpp>' \
    '#include <torch/csrc/distributed/c10d/reducer.hpp>' >"$log/pch.hpp"
  g++ "${flags[@]}" -x c++-header "$log/pch.hpp" -o "$log/pch.hpp.gch" 2>"$log/pch.err" || true
  if [[ -f $log/pch.hpp.gch ]]; then rm -f "$log/pch.err"; else rm -f "$log/pch.hpp"; fi
  printf '%s\n' "${sources[@]}" | xargs -P "$jobs" -I{} bash -c '
    src=$1 log=$2 cuda=$3 root=$4 nccl=$5; shift 5
    extra=()
    [[ -f $log/pch.hpp ]] && extra=(-include "$log/pch.hpp")
    [[ " $nccl " == *" $src "* ]] && extra=(-DUSE_C10D_NCCL -DLSPAWN_HAVE_NCCL=1 -isystem "$cuda")
    out=$log/$(echo "$src" | tr / _).err
    if g++ "$@" -fsyntax-only "${extra[@]}" "$root/$src" 2>"$out"; then rm -f "$out"; fi
  ' _ {} "$log" "$cuda_inc" "$root" "${nccl_sources[*]}" "${flags[@]}"
  rm -f "$log/pch.hpp" "$log/pch.hpp.gch"
  n_failed=$(ls "$log" | wc -l)
  echo "check-torch-range: torch $v: $((${#sources[@]} - n_failed))/${#sources[@]} sources compile ($((SECONDS - start)) s)"
  for f in "$log"/*.err; do
    [[ -e $f ]] || continue
    failed=1
    echo "  FAILED $(basename "$f" .err):"
    grep -m3 'error' "$f" | sed 's/^/    /'
  done
  rm -rf "$log"
done
exit $failed
