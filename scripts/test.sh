#!/usr/bin/env bash
# Sets up a fresh machine, builds lspawn against the LibTorch versions it supports and runs the whole
# test suite against each (this is what CI runs; docs/gpu.md#supported-libtorch):
#   1. Debian's LibTorch 1.13 (apt)                          → build/
#   2. the newest 2.x: PyPI's torch 2.15, CUDA build run on   → build-torch2/
#      the CPU, NCCL backend compiled in (-DLSPAWN_WITH_NCCL=ON, against the NCCL torch was built with)
#   3. the oldest 2.x: PyPI's torch 2.4.1, for the CPU alone  → build-torch2.4/
#      (scripts/setup-torch-cpu.sh, cmake/TorchCpuOnly.cmake: pre-C++11 ABI, CUDA 12 wheel)
# Usage: scripts/test.sh                 # every line, the quick run (CI's): every test but those
#                                        # labelled `long` (tests/CMakeLists.txt)
#        scripts/test.sh --full          # every line, every test (the `long` ones too)
#        scripts/test.sh --line 1.13     # or --line 2 (2.15) or --line 2.4: one line only
#        LSPAWN_TORCH2_VERSION=2.11.0 scripts/test.sh --line 2   # line 2 with another CUDA
#                                        # release (its NCCL compiled in) → build-torch-2.11.0/
#        scripts/test.sh --asan          # also an ASan+UBSan build (1.13) in build-asan/
#        scripts/test.sh --tsan          # only: a ThreadSanitizer build (1.13) in build-tsan/ of the
#                                        # supervisor, hang, cluster, launcher, spawn, e2e and
#                                        # collectives tests and DDP's comm hook, run under TSan
#                                        # (docs/reliability.md)
# Every run but --tsan ends with the fuzz smoke run (scripts/fuzz.sh: each fuzz target
# LSPAWN_FUZZ_SECONDS, default 5 s, as a ctest test in build-fuzz/); LSPAWN_SKIP_FUZZ=1 skips it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
asan=0 tsan=0 full=0
lines=(1.13 2 2.4)
while (($#)); do
  case $1 in
    --asan) asan=1 ;;
    --tsan) tsan=1 ;;
    --full) full=1 ;;
    --line) lines=("$2"); shift ;;
    *) echo "test.sh: unknown argument '$1' (expected --full, --asan, --tsan, --line 1.13|2|2.4)" >&2; exit 2 ;;
  esac
  shift
done
bash scripts/install-deps.sh
echo "test.sh: install-deps took $SECONDS s"
# The C++ layout (.clang-format, applied to every file once): checked first, in seconds, so a
# misformatted change fails before an hour of builds. scripts/format.sh rewrites the files.
if ! format_out=$(bash scripts/format.sh --check 2>&1); then
  echo "$format_out" | tail -20 >&2
  echo "test.sh: the files above differ from .clang-format: run scripts/format.sh and commit" >&2
  exit 1
fi

# Disk: what a clean clone's run writes per line, build directory and .deps/ together, measured
# (docs/reliability.md, "Disk"). Said up front when less is free, and again when a step fails: a
# compiler that cannot write says only "No space left on device", and the disk may be shared.
declare -A line_gb=([1.13]=2.7 [2]=5.0 [2.4]=4.3)
need_gb=0.2  # build-fuzz/
if ((tsan)); then
  need_gb=3.5
else
  for line in "${lines[@]}"; do need_gb=$(awk -v a="$need_gb" -v b="${line_gb[$line]:-5}" 'BEGIN { print a + b }'); done
  ((asan)) && need_gb=$(awk -v a="$need_gb" 'BEGIN { print a + 4.0 }')
fi
free_gb() { df -Pk "$root" | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }'; }
free=$(free_gb)
if awk -v f="$free" -v n="$need_gb" 'BEGIN { exit !(f < n) }'; then
  echo "test.sh: warning: $free GB free on the disk of $root; a clean run of what was asked" \
       "writes about $need_gb GB (less where build directories are already there; docs/reliability.md, \"Disk\")" >&2
fi
trap 'rc=$?; if ((rc)); then echo "test.sh: failed (exit $rc); $(free_gb) GB free on the disk of $root" >&2; fi' EXIT

if ((tsan)); then
  # The torch-free parts' tests, spawn, e2e and collectives tests (and the binaries they start) under
  # ThreadSanitizer, against LibTorch 1.13. LibTorch and gloo are not instrumented:
  # scripts/tsan.supp silences reports inside them only.
  start=$SECONDS
  cmake -S "$root" -B "$root/build-tsan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLSPAWN_TSAN=ON \
    -DLSPAWN_BUILD_TESTS=ON -DLSPAWN_BUILD_BENCH=OFF -DLSPAWN_BUILD_EXAMPLES=OFF >/dev/null
  # tests/CMakeLists.txt checks at configure time that every target named here exists, and every
  # tag of the exclusions below is used by a test: a rename fails the build, not the TSan run.
  tsan_targets=(lspawn lspawn-guardian lspawn_sys_tests lspawn_launchenv_tests lspawn_supervisor_tests lspawn_hang_tests lspawn_cluster_tests lspawn_launcher_tests spawn_core_tests spawn_tests lspawn_test_worker lspawn_test_hang_worker lspawn_e2e_tests collectives_test shm_communicator_test lspawn_collectives_test_worker lspawn_status_tests lspawn_runtime_tests lspawn_runtime_test_worker lspawn_gloo_guard_tests strategies_test lspawn_strategies_test_worker)
  cmake --build "$root/build-tsan" -j "${LSPAWN_JOBS:-$(nproc)}" --target "${tsan_targets[@]}"
  echo "test.sh: TSan build took $((SECONDS - start)) s"
  export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 suppressions=$root/scripts/tsan.supp"
  failed=0
  tsan_run() {  # $1: test binary under build-tsan/, then its arguments
    local t=$1
    shift
    echo "test.sh: --tsan: $t $*"
    (cd "$root/build-tsan/$(dirname "$t")" && timeout 900 "./$(basename "$t")" "$@") ||
      { echo "test.sh: --tsan: $t FAILED"; failed=1; }
  }
  # Not under TSan: the cases tagged [counts-threads], which count the process's threads (TSan's
  # runtime starts a thread of its own, so "2 threads" reads "3 threads" and StartMethod::Fork
  # refuses a process that is single-threaded without TSan; docs/reliability.md,
  # "ThreadSanitizer"). A tag, not names: a renamed case keeps its tag.
  tsan_excluded_tags=(counts-threads)
  excluded=()
  for tag in "${tsan_excluded_tags[@]}"; do excluded+=("~[$tag]"); done
  for t in tests/sys/lspawn_sys_tests tests/launchenv/lspawn_launchenv_tests tests/supervisor/lspawn_supervisor_tests tests/hang/lspawn_hang_tests tests/cluster/lspawn_cluster_tests \
           tests/launcher/lspawn_launcher_tests tests/spawn/spawn_core_tests tests/spawn/spawn_tests \
           tests/e2e/lspawn_e2e_tests tests/collectives/shm_communicator_test tests/collectives/collectives_test; do
    tsan_run "$t" "${excluded[@]}"
  done
  # The status record's seqlock (a reader racing a writer) and rank 0's store gate (its relay
  # thread in front of a real TCPStore).
  tsan_run tests/status/lspawn_status_tests
  tsan_run tests/runtime/lspawn_runtime_tests '[store_gate]'
  # The gloo guard (runtime/gloo_guard.hpp): its accept()/connect() on gloo's threads and, on
  # 1.13, the relay thread of a pair a stranger reached first; in one process, then in real ranks.
  tsan_run tests/runtime/lspawn_gloo_guard_tests
  tsan_run tests/runtime/lspawn_runtime_tests "secured rendezvous: strangers on gloo*"
  # DDP's comm hook: the autograd thread queues buckets, the hook's thread runs them through shm or
  # the hierarchy (a rank dying mid-training included). Not [spawn]: those fork (thread count).
  tsan_run tests/strategies/strategies_test '[ddp]'
  exit $failed
fi

run_suite() {   # $1: build dir, $2: ctest's -j, then extra ctest arguments
  # Each test has its own timeout so a hang fails the test instead of stalling CI. No test is
  # retried: one failure fails the suite (a test that depends on a quiet machine is fixed to wait
  # on an event, not retried; docs/reliability.md "No retries"). Four at once on 2 cores: many
  # tests wait (on their processes' start-up, sockets, timeouts) more than they compute, and the
  # suite keeps the cores ~90 % busy this way (the 1.13 suite: 350 s against 436 s with -j2;
  # docs/reliability.md, "CI time"). Sanitizer builds, 2-5x slower per process, keep 2.
  # Without --full, the tests labelled `long` are left out (CI's 25 minutes; each names the
  # quicker test that covers its subject).
  local dir=$1 jobs=$2
  shift 2
  ((full)) || set -- -LE long "$@"
  ctest --test-dir "$dir" --output-on-failure --timeout 300 -j "${LSPAWN_TEST_JOBS:-$jobs}" "$@"
}

# The 2.x lines' LibTorch setups (pip downloads and unpacks: network and disk more than CPU)
# start now in the background, and each line waits for its own when it comes: they overlap the
# 1.13 line's build and tests instead of following them.
declare -A setup_pid=()
setup_dir=$(mktemp -d "${TMPDIR:-/tmp}/lspawn-setup.XXXXXX")
trap 'rc=$?; for p in "${setup_pid[@]}"; do kill "$p" 2> /dev/null || true; done; rm -rf "$setup_dir"
      if ((rc)); then echo "test.sh: failed (exit $rc); $(free_gb) GB free on the disk of $root" >&2; fi' EXIT
start_setup() {  # $1: line (2 or 2.4)
  case $1 in
    2) bash scripts/setup-torch2.sh > "$setup_dir/$1.out" 2> "$setup_dir/$1.err" & ;;
    2.4) bash scripts/setup-torch-cpu.sh 2.4.1 > "$setup_dir/$1.out" 2> "$setup_dir/$1.err" & ;;
    *) return 0 ;;
  esac
  setup_pid[$1]=$!
}
finish_setup() {  # $1: line; sets `setup_result` to what its setup script printed (the venv or LibTorch folder)
  local rc=0
  wait "${setup_pid[$1]}" || rc=$?
  unset "setup_pid[$1]"
  cat "$setup_dir/$1.err" >&2
  ((rc == 0)) || { echo "test.sh: the LibTorch setup of line $1 failed (exit $rc; its output is above)" >&2; exit "$rc"; }
  setup_result=$(cat "$setup_dir/$1.out")
}
if ((!tsan)); then
  for line in "${lines[@]}"; do start_setup "$line"; done
fi

# A line's build directory, once its tests passed, is removed when the disk could not hold the
# lines still to come (their build directories, ~3 GB each, and the wheel, cross and fuzz builds):
# the CI's disk is shared and a clean clone's run writes ~12 GB at its peak (docs/reliability.md,
# "Disk"; a CI run of 2026-11-28 ran out of it in the third line's first compile). With enough
# free it stays for an incremental rebuild; LSPAWN_KEEP_BUILDS=1 always keeps it.
prune_build() {  # $1: build dir, $2: the line that just passed
  [[ ${LSPAWN_KEEP_BUILDS:-0} == 1 ]] && return 0
  local line=$2 later=0 l seen=0
  for l in "${lines[@]}"; do
    ((seen)) && later=$((later + 1))
    [[ $l == "$line" ]] && seen=1
  done
  local want free
  want=$(awk -v n="$later" 'BEGIN { print n * 3.0 + 1.5 }')
  free=$(free_gb)
  if awk -v f="$free" -v w="$want" 'BEGIN { exit !(f < w) }'; then
    local size
    size=$(du -sh "$1" 2> /dev/null | cut -f1)
    rm -rf "$1"
    echo "test.sh: removed $1 ($size) after line $line passed: $free GB free, the rest of the run" \
         "wants $want GB (LSPAWN_KEEP_BUILDS=1 keeps it); $(free_gb) GB free now"
  fi
}

# The test sets of each line (tests/CMakeLists.txt): the launcher's tests (torch-free code, the
# same on every line) on the 1.13 line only, the python set on the lines with a Python torch of
# their own (2.4.1 has none: its Python tests would be the 1.13 line's again). One line asked
# alone (--line) gets every set.
declare -A line_sets=([1.13]="launcher;torch;python" [2]="torch;python" [2.4]="torch")
if ((${#lines[@]} == 1)); then line_sets[${lines[0]}]="launcher;torch;python"; fi
for line in "${lines[@]}"; do
  start=$SECONDS
  sets=${line_sets[$line]:-}
  case $line in
    1.13)
      dir=$root/build
      skip=()
      bash scripts/build.sh "$dir" -DLSPAWN_BUILD_TESTS=ON -DLSPAWN_TEST_SET="$sets"  # ON: run-example.sh may have cached OFF
      ;;
    2)
      dir=$root/build-torch2
      [[ ${LSPAWN_TORCH2_VERSION:-2.15.0} == 2.15.0 ]] || dir=$root/build-torch-$LSPAWN_TORCH2_VERSION
      skip=()
      finish_setup 2
      venv=$setup_result
      echo "test.sh: LibTorch $line: waited $((SECONDS - start)) s for its setup (started at the beginning)"
      bash scripts/build.sh "$dir" -DLSPAWN_BUILD_TESTS=ON -DLSPAWN_TEST_SET="$sets" -DLSPAWN_BUILD_BENCH=OFF \
        -DCMAKE_PREFIX_PATH="$venv/torch/share/cmake" -DLSPAWN_WITH_NCCL=ON \
        -DLSPAWN_NCCL_INCLUDE="$venv/nvidia/nccl/include" -DLSPAWN_NCCL_LIB="$venv/nvidia/nccl/lib/libnccl.so.2" \
        -DLSPAWN_TEST_PYTHON="$venv/bin/python"
      ;;
    2.4)
      # The oldest 2.x of the supported range, CPU only (no Python of its own: its torch needs
      # CUDA 12's libraries to import; the interop tests use Debian's Python torch).
      dir=$root/build-torch2.4
      skip=()
      finish_setup 2.4
      torch_dir=$setup_result
      echo "test.sh: LibTorch $line: waited $((SECONDS - start)) s for its setup (started at the beginning)"
      bash scripts/build.sh "$dir" -DLSPAWN_BUILD_TESTS=ON -DLSPAWN_TEST_SET="$sets" -DLSPAWN_BUILD_BENCH=OFF \
        -DLSPAWN_TORCH_CPU_DIR="$torch_dir" -DLSPAWN_WITH_NCCL=OFF -DLSPAWN_TEST_PYTHON=/usr/bin/python3
      ;;
    *) echo "test.sh: unknown LibTorch line '$line' (expected 1.13, 2 or 2.4)" >&2; exit 2 ;;
  esac
  echo "test.sh: LibTorch $line (tests: $sets): setup + build took $((SECONDS - start)) s"
  start=$SECONDS
  run_suite "$dir" 4 "${skip[@]}"
  echo "test.sh: LibTorch $line: tests took $((SECONDS - start)) s"
  prune_build "$dir" "$line"
done
# The Python package (docs/python.md): the wheel built from the sdist, installed into a fresh venv
# and used from there (tests/wheel/run.sh); once, not per LibTorch line (it links no LibTorch).
# LSPAWN_SKIP_WHEEL=1 skips it.
if [[ "${LSPAWN_SKIP_WHEEL:-0}" != 1 ]]; then
  start=$SECONDS
  bash tests/wheel/run.sh
  echo "test.sh: wheel build + tests took $((SECONDS - start)) s"
fi
# The cross-built wheels (docs/python.md, "Which wheel"): manylinux_2_17 x86_64 used here, aarch64
# under qemu-user (tests/wheel/cross.sh; ~65 s with zig's and ccache's caches warm, each wheel
# built in 15 s; ~2 min more per wheel with either cold; docs/reliability.md, "CI time").
# LSPAWN_SKIP_CROSS=1 skips it.
if [[ "${LSPAWN_SKIP_WHEEL:-0}" != 1 && "${LSPAWN_SKIP_CROSS:-0}" != 1 ]]; then
  start=$SECONDS
  bash tests/wheel/cross.sh
  echo "test.sh: cross wheels' builds + tests took $((SECONDS - start)) s"
fi
# libFuzzer smoke runs of the parsers of untrusted input (fuzz/, every target), in a clang build
# of their own; once, not per LibTorch line (the fuzzed parsers are torch-free).
if [[ "${LSPAWN_SKIP_FUZZ:-0}" != 1 ]]; then
  start=$SECONDS
  bash scripts/fuzz.sh "${LSPAWN_FUZZ_SECONDS:-5}"
  echo "test.sh: fuzz build + runs took $((SECONDS - start)) s"
fi
if ((asan)); then
  start=$SECONDS
  LSPAWN_SANITIZE=1 bash scripts/build.sh "$root/build-asan" -DLSPAWN_BUILD_TESTS=ON -DLSPAWN_BUILD_BENCH=OFF
  echo "test.sh: ASan build took $((SECONDS - start)) s"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 run_suite "$root/build-asan" 2
fi
echo "test.sh: passed in $SECONDS s"
