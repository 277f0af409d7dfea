#!/usr/bin/env bash
# The Python side of lspawn (python/lspawn_hang.py, python/lspawn_preload.py: what a Python worker
# runs) against each torch of the supported range that imports on this machine, by hand:
#   bash scripts/check-python-range.sh BUILD_DIR [VERSION...]
# BUILD_DIR: any build with tests (the launcher is torch-free; the Python tests run the Python given
# in LSPAWN_TEST_PYTHON). VERSION: PyPI torch releases (default: 2.11.0 2.12.1 2.13.0 2.14.1 2.15.0),
# each set up by scripts/setup-torch2.sh in a venv of its own (~1.8 GB, ~50 s; Lightning included).
#
# Why from 2.11: PyPI's torch wheels up to 2.10 are built for CUDA 12 and do not import without
# CUDA 12's libraries (cuBLAS, cuDNN, … several GB of nvidia wheels); this machine's toolkit is
# CUDA 13.0, which the 2.11+ wheels (cu130, cu132) load. The C++ side of 2.4-2.10 is checked by
# scripts/check-torch-range.sh and CI's 2.4.1 line.
#
# Per release: the python hang and python preload e2e tests (tests/e2e/python_*_e2e_test.cpp, which
# read LSPAWN_TEST_PYTHON at run time), and which Flight Recorder API lspawn_hang found. Exit 1 if
# any release failed; a table at the end.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if (($# < 1)) || [[ ! -f $1/CTestTestfile.cmake ]]; then
  echo "usage: check-python-range.sh BUILD_DIR [VERSION...] (BUILD_DIR: a build with tests, e.g. build)" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
shift
versions=("$@")
((${#versions[@]})) || versions=(2.11.0 2.12.1 2.13.0 2.14.1 2.15.0)
rows=()
failed=0
for v in "${versions[@]}"; do
  if ! venv=$(LSPAWN_TORCH2_VERSION=$v bash "$root/scripts/setup-torch2.sh"); then
    rows+=("| $v | setup failed (scripts/setup-torch2.sh's message above) | |")
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
  rows+=("| $v | $result ($summary, $((SECONDS - start)) s) | $api |")
done
echo
echo "| torch | python hang + python preload e2e tests | torch, Flight Recorders lspawn_hang reads |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
exit $failed
