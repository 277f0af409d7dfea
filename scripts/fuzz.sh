#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan, coverage) into build-fuzz/ and
# runs each one as a short smoke test through ctest (label "fuzz").
# Usage: scripts/fuzz.sh [SECONDS]        (default 10 s per target; CI uses the default)
#        build-fuzz/fuzz/<name>_fuzz CORPUS_DIR   # to fuzz one parser for longer by hand
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${LSPAWN_FUZZ_BUILD:-$root/build-fuzz}
seconds=${1:-10}
jobs=${LSPAWN_JOBS:-$(nproc)}
cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DLSPAWN_BUILD_FUZZ=ON -DLSPAWN_FUZZ_SECONDS="$seconds" \
  -DLSPAWN_BUILD_TESTS=OFF -DLSPAWN_BUILD_EXAMPLES=OFF -DLSPAWN_BUILD_BENCH=OFF >/dev/null
cmake --build "$dir" --target lspawn_fuzzers -j "$jobs"
# One target per core at once: each runs for its SECONDS whatever else runs, so the cores share
# the wall time, not the fuzzing time.
ctest --test-dir "$dir" -L fuzz --output-on-failure -j "$jobs"
