#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang into build-fuzz/ and runs each for a while.
# Usage: scripts/fuzz.sh [SECONDS]     # default 10 per target (the CI smoke run uses 5)
# Only the fuzz targets and the torch-free libraries they call are compiled.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-10}
dir="$root/build-fuzz"
CC=clang CXX=clang++ cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLSPAWN_BUILD_FUZZ=ON -DLSPAWN_BUILD_TESTS=OFF -DLSPAWN_BUILD_BENCH=OFF -DLSPAWN_BUILD_EXAMPLES=OFF \
  -DLSPAWN_FUZZ_SECONDS="$seconds" >/dev/null
cmake --build "$dir" --target lspawn_fuzzers -j "${LSPAWN_JOBS:-$(nproc)}"
ctest --test-dir "$dir" -L fuzz --output-on-failure
