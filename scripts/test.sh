#!/usr/bin/env bash
# Sets up a fresh machine, builds lspawn against both LibTorch lines and runs the whole test suite
# against each (this is what CI runs):
#   1. Debian's LibTorch 1.13 (apt)                     → build/
#   2. PyPI's LibTorch 2.x, CUDA build run on the CPU,  → build-torch2/
#      NCCL backend compiled in (-DLSPAWN_WITH_NCCL=ON, the CUDA toolkit's NCCL)
# Usage: scripts/test.sh                 # both lines
#        scripts/test.sh --line 1.13     # or --line 2: one line only
#        scripts/test.sh --asan          # also an ASan+UBSan build (1.13) in build-asan/
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
asan=0
lines=(1.13 2)
while (($#)); do
  case $1 in
    --asan) asan=1 ;;
    --line) lines=("$2"); shift ;;
    *) echo "test.sh: unknown argument '$1' (expected --asan, --line 1.13|2)" >&2; exit 2 ;;
  esac
  shift
done
bash scripts/install-deps.sh

run_suite() {   # $1: build dir
  # Each test has its own timeout so a hang fails the test instead of stalling CI.
  ctest --test-dir "$1" --output-on-failure --timeout 300 -j "${LSPAWN_TEST_JOBS:-2}"
}

for line in "${lines[@]}"; do
  start=$SECONDS
  case $line in
    1.13)
      dir=$root/build
      bash scripts/build.sh "$dir" -DLSPAWN_BUILD_TESTS=ON  # ON: run-example.sh may have cached OFF
      ;;
    2)
      dir=$root/build-torch2
      venv=$(bash scripts/setup-torch2.sh)
      bash scripts/build.sh "$dir" -DLSPAWN_BUILD_TESTS=ON -DLSPAWN_BUILD_BENCH=OFF \
        -DCMAKE_PREFIX_PATH="$venv/torch/share/cmake" -DLSPAWN_WITH_NCCL=ON \
        -DLSPAWN_TEST_PYTHON="$venv/bin/python"
      ;;
    *) echo "test.sh: unknown LibTorch line '$line' (expected 1.13 or 2)" >&2; exit 2 ;;
  esac
  echo "test.sh: LibTorch $line: build took $((SECONDS - start)) s"
  start=$SECONDS
  run_suite "$dir"
  echo "test.sh: LibTorch $line: tests took $((SECONDS - start)) s"
done
# libFuzzer smoke runs of the parsers of untrusted text (fuzz/), in a clang build of their own.
start=$SECONDS
bash scripts/fuzz.sh "${LSPAWN_FUZZ_SECONDS:-10}"
echo "test.sh: fuzz build + runs took $((SECONDS - start)) s"
if ((asan)); then
  start=$SECONDS
  LSPAWN_SANITIZE=1 bash scripts/build.sh "$root/build-asan" -DLSPAWN_BUILD_TESTS=ON -DLSPAWN_BUILD_BENCH=OFF
  echo "test.sh: ASan build took $((SECONDS - start)) s"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 run_suite "$root/build-asan"
fi
