#!/usr/bin/env bash
# Sets up a fresh machine, builds lspawn and runs the whole test suite (this is what CI runs).
# Usage: scripts/test.sh            # normal build in build/, then ctest
#        scripts/test.sh --asan     # also an ASan+UBSan build in build-asan/ and the suite under it
#        scripts/test.sh --tsan     # only: a ThreadSanitizer build in build-tsan/ of the launcher,
#                                   # spawn and collectives tests, run under TSan (docs/reliability.md)
#        (every run, CI included, ends with the fuzz smoke run: scripts/fuzz.sh 5 — each fuzz target
#         5 s as a ctest test in build-fuzz/; LSPAWN_SKIP_FUZZ=1 skips it)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh
asan=0 tsan=0
for arg in "$@"; do
  case "$arg" in
    --asan) asan=1 ;;
    --tsan) tsan=1 ;;
    *) echo "test.sh: unknown option $arg (--asan, --tsan)" >&2; exit 2 ;;
  esac
done

if ((tsan)); then
  # The launcher, spawn and collectives tests (and the binaries they start) under ThreadSanitizer.
  # LibTorch and gloo are not instrumented: scripts/tsan.supp silences reports inside them only.
  start=$SECONDS
  cmake -S "$root" -B "$root/build-tsan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLSPAWN_TSAN=ON \
    -DLSPAWN_BUILD_TESTS=ON -DLSPAWN_BUILD_BENCH=OFF -DLSPAWN_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$root/build-tsan" -j "${LSPAWN_JOBS:-$(nproc)}" --target \
    lspawn lspawn-guardian lspawn_launcher_tests spawn_core_tests spawn_tests lspawn_test_worker \
    lspawn_e2e_tests collectives_test shm_communicator_test lspawn_collectives_test_worker
  echo "test.sh: TSan build took $((SECONDS - start)) s"
  export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 suppressions=$root/scripts/tsan.supp"
  failed=0
  # Not under TSan (for now): the cases that write or read an error report as protobuf JSON
  # crash inside protobuf's inline Map code when it is instrumented and libprotobuf is not
  # (SEGV in google/protobuf/map.h TableEntryIsNonEmptyList). protobuf leaves the tree with the
  # proto-json change; these exclusions go with it.
  # Also not: a worker that throws (it writes an error report), lspawn reading error reports
  # (the two e2e cases below), and the forkserver's thread check (TSan's runtime starts a thread
  # of its own, so "2 threads" reads "3 threads").
  no_protobuf_json=('~error file:*' '~*ErrorReport*' '~*error report*' '~*throw*'
                    '~the root cause is the earliest failure - not the first exit'
                    '~a torchrun-format error file (Python @record) is in the summary too'
                    '~forkserver: threads running after static initialisation make it refuse'
                    '~spawn: a sibling that exits on its own within the grace period is not killed')
  for t in tests/launcher/lspawn_launcher_tests tests/spawn/spawn_core_tests tests/spawn/spawn_tests \
           tests/e2e/lspawn_e2e_tests tests/collectives/shm_communicator_test tests/collectives/collectives_test; do
    echo "test.sh: --tsan: $t"
    (cd "$root/build-tsan/$(dirname "$t")" && timeout 900 "./$(basename "$t")" "${no_protobuf_json[@]}") ||
      { echo "test.sh: --tsan: $t FAILED"; failed=1; }
  done
  exit $failed
fi

run_suite() {   # $1: build dir
  # Each test has its own timeout so a hang fails the test instead of stalling CI.
  ctest --test-dir "$1" --output-on-failure --timeout 300 -j "${LSPAWN_TEST_JOBS:-2}"
}

start=$SECONDS
bash scripts/build.sh "$root/build" -DLSPAWN_BUILD_TESTS=ON  # ON: run-example.sh may have cached OFF
echo "test.sh: build took $((SECONDS - start)) s"
run_suite "$root/build"
if ((asan)); then
  start=$SECONDS
  LSPAWN_SANITIZE=1 bash scripts/build.sh "$root/build-asan" -DLSPAWN_BUILD_TESTS=ON -DLSPAWN_BUILD_BENCH=OFF
  echo "test.sh: ASan build took $((SECONDS - start)) s"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 run_suite "$root/build-asan"
fi
if [[ "${LSPAWN_SKIP_FUZZ:-0}" != 1 ]]; then
  start=$SECONDS
  bash scripts/fuzz.sh 5   # a short run of every fuzz target (docs/reliability.md has a long one)
  echo "test.sh: fuzz smoke run took $((SECONDS - start)) s"
fi
