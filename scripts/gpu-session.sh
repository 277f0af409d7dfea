#!/usr/bin/env bash
# Everything issue #20 leaves to a machine with an NVIDIA GPU, in one device call (docs/gpu.md, "How
# to run it when a GPU machine is lent"). A session that is lent a GPU gets 15 minutes of device time,
# the machine's start included, and the machine is given back 30 s after a call, so the build and
# every check share one call:
#
#   S=$(date +%s); LOG_DIR=$OUT bash .gpu/build-cuda.sh \
#     "bash \"\$OLDPWD/scripts/gpu-session.sh\" --build . --out \"\$LOG_DIR\" --until $((S + 560))"
#
# After .gpu/build-cuda.sh has built lspawn (it leaves cmake.log and ninja.log in $LOG_DIR), this runs
#   1. scripts/gpu-check.sh (the benchmark against gloo, DDP's NCCL default, shm on one GPU, ...),
#   2. the whole suite (ctest), with what is left of the time,
# each stopped before --until so that the logs are packed before the device call's own limit. The
# device tool brings back at most 8 files from $OUT, so --out gets 6 at most besides the build's 2:
#   summary.txt    gpu-check's PASS/FAIL lines, the shm/gloo ratios, ctest's result and its failures
#   bench-*.json   the benchmark's rows (shm and gloo at N = 2; NCCL), for docs/benchmarks.md
#   ctest.log      the suite's output
#   gpu-logs.tar.gz  every log of both steps (packed again after each step, so a kill keeps them)
#
#   bash scripts/gpu-session.sh [--build DIR] [--out DIR] [--until EPOCH_S] [--device cuda|cpu]
#                               [--python PY] [--tests REGEX] [--jobs N] [--suite-dir DIR]
#
# --until: the time (seconds since the epoch) by which everything must be packed; default now + 420.
# --device cpu, --tests, --suite-dir: how this script is tested without a GPU (ctest
#   e2e.gpu_session_script_on_cpu): gpu-check.sh's CPU checks, and only the tests REGEX names (ctest -R)
#   of the ctest directory DIR (default: --build) instead of the whole suite.
# Exit status: 0 when every check and test passed; else 1 for gpu-check (a check failed, or it was
# stopped or not run) plus 4 for the suite (likewise), so 1, 4 or 5; 2 for bad arguments.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$here/build
out=""
until_s=$(( $(date +%s) + 420 ))
device=cuda
py=$(command -v python3 || true)
tests=""
suite=""
jobs=$(nproc)
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || { echo "gpu-session.sh: '$1' needs a value" >&2; exit 2; }
  case "$1" in
    --build) build=$(cd "$2" && pwd) || { echo "gpu-session.sh: --build: no directory '$2'" >&2; exit 2; } ;;
    --out) out=$2 ;;
    --until) until_s=$2 ;;
    --device) device=$2 ;;
    --python) py=$2 ;;
    --tests) tests=$2 ;;
    --jobs) jobs=$2 ;;
    --suite-dir) suite=$2 ;;
    *) echo "gpu-session.sh: unknown argument '$1' (--build DIR --out DIR --until EPOCH_S --device cuda|cpu --python PY --tests REGEX --jobs N --suite-dir DIR)" >&2
       exit 2 ;;
  esac
  shift 2
done
[ -n "$out" ] || { echo "gpu-session.sh: --out DIR is required (the device call's \$OUT)" >&2; exit 2; }
case "$until_s" in ''|*[!0-9]*) echo "gpu-session.sh: --until: '$until_s' is not seconds since the epoch" >&2; exit 2 ;; esac
case "$jobs" in ''|*[!0-9]*|0) echo "gpu-session.sh: --jobs: '$jobs' is not a positive number" >&2; exit 2 ;; esac
[ -x "$build/launcher/lspawn" ] || { echo "gpu-session.sh: $build is not a build directory of lspawn: no launcher/lspawn (--build DIR)" >&2; exit 2; }
suite=${suite:-$build}
[ -f "$suite/CTestTestfile.cmake" ] || { echo "gpu-session.sh: --suite-dir: $suite has no CTestTestfile.cmake" >&2; exit 2; }
mkdir -p "$out" || exit 2

work=$(mktemp -d "${TMPDIR:-/tmp}/lspawn-gpu-session.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/gpu-check"
left() { echo $(( until_s - $(date +%s) )); }
summary=$out/summary.txt
: > "$summary"
say() { echo "$1" >> "$summary"; echo "gpu-session: $1"; }
# pack: the logs so far into one archive in --out (the device tool's 8 files), the JSON beside it.
pack() {
  for j in "$work"/gpu-check/bench-*.json; do [ -f "$j" ] && cp "$j" "$out/"; done
  [ -f "$work/ctest.log" ] && cp "$work/ctest.log" "$out/ctest.log"
  tar -C "$work" -czf "$out/gpu-logs.tar.gz.tmp" . && mv "$out/gpu-logs.tar.gz.tmp" "$out/gpu-logs.tar.gz"
}

say "# gpu-session: build $build, device $device, $(date -u +%FT%TZ), $(left) s left"
check_failed=0 suite_failed=0

# 1. gpu-check.sh, with up to all but 150 s of what is left (the suite gets the rest).
budget=$(( $(left) - 150 )); [ "$budget" -lt 60 ] && budget=$(( $(left) - 30 ))
if [ "$budget" -lt 5 ]; then
  say "gpu-check: NOT RUN: only $(left) s left before --until"; check_failed=1
else
  t0=$(date +%s)
  timeout -k 5 "$budget" bash "$here/scripts/gpu-check.sh" --build "$build" --out "$work/gpu-check" \
    --device "$device" ${py:+--python "$py"} > "$work/gpu-check.log" 2>&1
  rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    say "gpu-check: STOPPED after $budget s (--until); the checks it finished:"; check_failed=1
  elif [ $rc != 0 ]; then
    say "gpu-check: exit $rc ($(( $(date +%s) - t0 )) s)"; check_failed=1
  else
    say "gpu-check: all passed or skipped ($(( $(date +%s) - t0 )) s)"
  fi
  grep -E '^(PASS|FAIL|SKIP|INFO)' "$work/gpu-check/summary.txt" 2>/dev/null >> "$summary" \
    || grep -E '^== (PASS|FAIL|SKIP)' "$work/gpu-check.log" | sed 's/^== //' >> "$summary"
  [ -f "$work/gpu-check/bench-ratio.txt" ] && cat "$work/gpu-check/bench-ratio.txt" >> "$summary"
fi
pack

# 2. The suite, stopped 20 s before --until.
budget=$(( $(left) - 20 ))
if [ "$budget" -lt 5 ]; then
  say "suite: NOT RUN: only $(left) s left before --until"; suite_failed=1
else
  t0=$(date +%s)
  timeout -k 5 "$budget" ctest --test-dir "$suite" -j "$jobs" --timeout 120 --output-on-failure \
    ${tests:+-R "$tests"} > "$work/ctest.log" 2>&1
  rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    say "suite: STOPPED after $budget s (--until); $(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* +Passed' "$work/ctest.log") tests had passed"
    suite_failed=1
  else
    # CTest 3.x: 'N% tests passed, M tests failed out of T'; CTest 4.x drops ', 0 tests failed'.
    result=$(grep -E 'tests passed(, [0-9]+ tests failed)? out of' "$work/ctest.log")
    say "suite: ${result:-exit $rc, no test ran} ($(( $(date +%s) - t0 )) s)"
    [ -n "$result" ] || tail -n 5 "$work/ctest.log" | sed 's/^/    ctest: /' >> "$summary"
    [ $rc = 0 ] && [ -n "$result" ] || suite_failed=1
  fi
  sed -n '/The following tests FAILED/,$p' "$work/ctest.log" | grep -E '^\s+[0-9]+ - ' >> "$summary"
fi
pack

echo
cat "$summary"
exit $(( check_failed + 4 * suite_failed ))
