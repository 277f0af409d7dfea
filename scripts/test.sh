#!/usr/bin/env bash
# Sets up a fresh machine, builds lspawn and runs the whole test suite (this is what CI runs).
# Usage: scripts/test.sh            # normal build in build/, then ctest
#        scripts/test.sh --asan     # also an ASan+UBSan build in build-asan/ and the suite under it
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh
asan=0
[[ "${1:-}" == "--asan" ]] && asan=1

run_suite() {   # $1: build dir
  # Each test has its own timeout so a hang fails the test instead of stalling CI.
  ctest --test-dir "$1" --output-on-failure --timeout 300 -j "${LSPAWN_TEST_JOBS:-2}"
}

start=$SECONDS
bash scripts/build.sh "$root/build" -DLSPAWN_BUILD_TESTS=ON  # ON: run-example.sh may have cached OFF
echo "test.sh: build took $((SECONDS - start)) s"
run_suite "$root/build"
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
