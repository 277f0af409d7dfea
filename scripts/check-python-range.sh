#!/usr/bin/env bash
# The Python side of lspawn (python/lspawn_hang.py, python/lspawn_preload.py: what a Python worker
# runs) against each torch of the supported range that imports on this machine, by hand:
#   bash scripts/check-python-range.sh BUILD_DIR [VERSION...]
# BUILD_DIR: any build with tests (the launcher is torch-free; the Python tests run the Python given
# in LSPAWN_TEST_PYTHON). VERSION: PyPI torch releases (default: every release of the supported range,
# 2.4.1 2.5.1 2.6.0 2.7.1 2.8.0 2.9.1 2.10.0 2.11.0 2.12.1 2.13.0 2.14.1 2.15.0), each set up by
# scripts/setup-torch2.sh in a venv of its own: 2.11 on (CUDA 13 builds) borrow the machine's CUDA 13.0
# toolkit (~1.8 GB, ~50 s; Lightning included); 2.4-2.10 are CUDA 12 builds and get every CUDA 12
# wheel they pin, as a user's `pip install torch` does (~4.5-6.3 GB per venv, 45-70 s; 2.4.1's venv is
# .deps/torch-2.4.1-venv, beside CI's C++-only .deps/torch-2.4.1). About 6 min per release on 2 cores.
#
# Per release: the python hang and python preload e2e tests (tests/e2e/python_*_e2e_test.cpp, which
# read LSPAWN_TEST_PYTHON at run time), and which Flight Recorder API lspawn_hang found; then the
# torch.distributed backend: its shim built for that release by the users' command (`python -m
# lspawn.distributed build`) and its tests run with that Python against the build's engine
# (tests/python_backend/: ops, dead_rank, ddp, fsdp2, errors, launcher, lightning; LSPAWN_CHECK_BACKEND_TESTS to choose,
# empty: none). Exit 1 if any release failed; a table at the end.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if (($# < 1)) || [[ ! -f $1/CTestTestfile.cmake ]]; then
  echo "usage: check-python-range.sh BUILD_DIR [VERSION...] (BUILD_DIR: a build with tests, e.g. build)" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
shift
versions=("$@")
((${#versions[@]})) || versions=(2.4.1 2.5.1 2.6.0 2.7.1 2.8.0 2.9.1 2.10.0 2.11.0 2.12.1 2.13.0 2.14.1 2.15.0)
rows=()
failed=0
backend_tests=${LSPAWN_CHECK_BACKEND_TESTS-ops dead_rank ddp fsdp2 errors launcher lightning}
engine=$build/shm/liblspawn_engine.so
ccache_env=()  # the shim's compile through ccache, in its own cache (XDG_CACHE_HOME is moved below)
if command -v ccache >/dev/null && cache_dir=$(ccache --get-config cache_dir 2>/dev/null); then
  ccache_env=(CXX="ccache ${CXX:-c++}" CCACHE_DIR="$cache_dir")
fi
backend() {  # $1: the venv; prints "passed: TESTS" or "FAILED: TEST", the output of a failure on stderr
  local venv=$1 shims out t
  shims=$(mktemp -d)
  # XDG_CACHE_HOME: no shim of ~/.cache is found instead of the one built here
  local env=(PYTHONPATH="$root/python" LSPAWN_ENGINE="$engine" LSPAWN_BACKEND_SHIM_DIR="$shims"
             LSPAWN_BIN="$build/launcher/lspawn" XDG_CACHE_HOME="$shims/cache" OMP_NUM_THREADS=1 LSPAWN_TEST_SKIP_BUILD=1
             "${ccache_env[@]}")
  if ! out=$(env "${env[@]}" "$venv/bin/python" -m lspawn.distributed build --out "$shims" 2>&1); then
    echo "$out" >&2
    rm -rf "$shims"
    echo "FAILED: the shim's build"
    return 1
  fi
  local passed=() skipped=() rc
  for t in $backend_tests; do
    out=$(env "${env[@]}" timeout 600 "$venv/bin/python" "$root/tests/python_backend/${t}_test.py" 2>&1)
    rc=$?
    if ((rc == 77)); then  # the test's skip (ctest's SKIP_RETURN_CODE): its reason is its last line
      skipped+=("$t ($(echo "$out" | grep '^skipped: ' | tail -1 | cut -c10-150))")
    elif ((rc != 0)); then
      echo "$out" | tail -40 >&2
      rm -rf "$shims"
      echo "FAILED: ${t}_test.py"
      return 1
    else
      passed+=("$t")
    fi
  done
  rm -rf "$shims"
  echo "passed: shim built, ${#passed[@]} tests (${passed[*]})${skipped:+; skipped: ${skipped[*]}}"
}
for v in "${versions[@]}"; do
  if ! venv=$(LSPAWN_TORCH2_VERSION=$v bash "$root/scripts/setup-torch2.sh"); then
    rows+=("| $v | setup failed (scripts/setup-torch2.sh's message above) | | |")
    failed=1
    continue
  fi
  api=$(PYTHONPATH=$root/python "$venv/bin/python" -c \
    'import lspawn_hang, torch; print(torch.__version__, sorted(lspawn_hang._Watch._backends()) or "none (wrapped functions)")' 2>&1 | tail -1)
  start=$SECONDS
  log=$(mktemp)
  if LSPAWN_TEST_PYTHON=$venv/bin/python ctest --test-dir "$build" -R '^python (hang|preload):' \
       --timeout 300 -j "${LSPAWN_TEST_JOBS:-2}" --output-on-failure >"$log" 2>&1; then
    result="passed"
  else
    result="FAILED: $(grep -E '^\s+[0-9]+ - ' "$log" | sed 's/^\s*//' | tr '\n' ';')"
    cat "$log"
    failed=1
  fi
  summary=$(grep -E 'tests passed' "$log" | head -1)
  rm -f "$log"
  hang_row="$result ($summary, $((SECONDS - start)) s)"
  start=$SECONDS
  if [[ -z $backend_tests ]]; then
    backend_row="not run"
  elif [[ ! -f $engine ]]; then
    backend_row="not run: no $engine in BUILD_DIR"
    failed=1
  else
    backend_row=$(backend "$venv") || failed=1
    backend_row="$backend_row ($((SECONDS - start)) s)"
  fi
  rows+=("| $v | $hang_row | $backend_row | $api |")
done
echo
echo "| torch | python hang + python preload e2e tests | the torch.distributed backend | torch, Flight Recorders lspawn_hang reads |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit $failed
