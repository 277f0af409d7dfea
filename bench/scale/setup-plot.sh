#!/usr/bin/env bash
# A venv with matplotlib for bench/scale/run.py --plots, made idempotently; prints its python.
#   py=$(bash bench/scale/setup-plot.sh) && "$py" bench/scale/run.py --plots results/$(date -u +%F)-scale-nodes
# Environment: LSPAWN_PLOT_VENV (default <repo>/.deps/plot); PYTHON (default python3).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${LSPAWN_PLOT_VENV:-$root/.deps/plot}
stamp=$venv/.lspawn-matplotlib
if [[ ! -f $stamp ]]; then
  "${PYTHON:-python3}" -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'matplotlib>=3.7,<4' >&2
  touch "$stamp"
fi
echo "$venv/bin/python"
