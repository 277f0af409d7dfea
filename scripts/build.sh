#!/usr/bin/env bash
# Configures and builds lspawn into a build directory (default: build/).
# Usage: scripts/build.sh [BUILD_DIR] [extra cmake args…]
#   LSPAWN_SANITIZE=1 scripts/build.sh build-asan     # ASan+UBSan build
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build}
shift || true
args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo)
[[ "${LSPAWN_SANITIZE:-0}" == 1 ]] && args+=(-DLSPAWN_SANITIZE=ON)
jobs=${LSPAWN_JOBS:-$(nproc)}
start=$SECONDS
cmake -S "$root" -B "$dir" "${args[@]}" "$@" >/dev/null
configured=$SECONDS
cmake --build "$dir" -j "$jobs"
echo "build.sh: $(basename "$dir"): configure $((configured - start)) s, build $((SECONDS - configured)) s"
