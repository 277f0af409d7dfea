#!/usr/bin/env bash
# mp_test.py under every CPython from the oldest that pyproject.toml's requires-python admits to the
# newest found here (pyenv's versions, python3.X on PATH), each without torch: lspawn's Python side is
# pure Python over the standard library, so what a version lacks shows here (Python 3.8 has no
# os.pidfd_open: _context.py calls the system call itself). The oldest admitted version must be found,
# else the declaration is untested and this fails; a newer one absent is named and skipped.
# CI's quick subset (the default): the oldest admitted and the newest found, the versions most likely to lack
# or to have changed something; LSPAWN_PYTHONS_ALL=1 runs every minor version between (the full command,
# docs/python.md: 3.8 to 3.13 here, ~12 s each).
# Usage: pythons.sh PYPROJECT   (env: PYTHONPATH, LSPAWN_BIN, LSPAWN_GUARDIAN as tests/python_mp/CMakeLists.txt)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
oldest=$(sed -n 's/^requires-python = ">=3\.\([0-9]*\)"$/\1/p' "$1")
[[ -n $oldest ]] || { echo "pythons.sh: no 'requires-python = \">=3.N\"' line in $1" >&2; exit 1; }
find_python() {  # $1: minor version; prints an interpreter of 3.$1 or nothing
  local p
  for p in "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3."$1".*/bin/python "$(command -v "python3.$1" || true)"; do
    [[ -x $p ]] && "$p" -c "import sys; sys.exit(sys.version_info[:2] != (3, $1))" 2>/dev/null && { echo "$p"; return; }
  done
}
failed=0 ran=0
minors=$(seq "$oldest" 13)
if [[ ${LSPAWN_PYTHONS_ALL:-0} != 1 ]]; then
  newest=
  for m in $(seq 13 -1 "$((oldest + 1))"); do [[ -n $(find_python "$m") ]] && { newest=$m; break; }; done
  minors="$oldest $newest"
fi
# Each run's working folder (mp_test.py writes its scripts there), removed at the end.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/lspawn-pythons.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
for minor in $minors; do
  py=$(find_python "$minor")
  if [[ -z $py ]]; then
    ((minor == oldest)) && { echo "pythons.sh: FAILED: no Python 3.$minor here, the oldest requires-python admits" >&2; exit 1; }
    echo "pythons.sh: no Python 3.$minor here: skipped"
    continue
  fi
  if "$py" -c 'import torch' 2>/dev/null; then
    echo "pythons.sh: $py has torch: python_mp.torch covers that; this run is about the Python alone"
  fi
  start=$SECONDS
  if out=$(cd "$(mktemp -d "$scratch/3.$minor.XXXXXX")" && "$py" "$here/mp_test.py" 2>&1); then
    echo "pythons.sh: ok Python 3.$minor ($py): $(tail -3 <<<"$out" | grep -E '^OK' || echo OK) in $((SECONDS - start)) s"
  else
    echo "$out" | tail -60
    echo "pythons.sh: FAILED under Python 3.$minor ($py)" >&2
    failed=1
  fi
  ran=$((ran + 1))
done
echo "pythons.sh: $ran Pythons ($(echo $minors | sed 's/\([0-9]*\)/3.\1/g')), of 3.$oldest and newer${LSPAWN_PYTHONS_ALL:+ (all)}"
exit $failed
