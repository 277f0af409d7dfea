#!/usr/bin/env bash
# Bench-only: a virtual environment with Lightning (bench/training/lightning_bench.py) on top of the
# LibTorch 2.x venv's torch (scripts/setup-torch2.sh), idempotently; prints the venv's path.
#
#   venv=$(bash bench/training/setup-lightning.sh)
#   "$venv/bin/python" bench/training/lightning_bench.py --nprocs 2
#
# torch is not downloaded again: the new venv is made with the torch2 venv's interpreter and a
# .pth file puts the torch2 venv's site-packages on its path (after its own), so pip sees
# torch 2.x installed and only adds Lightning and its pure-Python dependencies. Nothing is
# installed into the torch2 venv itself.
#
# Environment: LSPAWN_LIGHTNING_VENV (default <repo>/.deps/lightning), LSPAWN_TORCH2_VENV
# (default <repo>/.deps/torch2, made by scripts/setup-torch2.sh when missing),
# LSPAWN_LIGHTNING_VERSION (2.6.*).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${LSPAWN_LIGHTNING_VENV:-$root/.deps/lightning}
version=${LSPAWN_LIGHTNING_VERSION:-2.6.*}
torch2=$(LSPAWN_TORCH2_VENV=${LSPAWN_TORCH2_VENV:-$root/.deps/torch2} bash "$root/scripts/setup-torch2.sh")
stamp=$venv/.lspawn-lightning-${version//\*/x}
if [[ -f $stamp ]]; then
  echo "$venv"
  exit 0
fi
log() { echo "setup-lightning: $*" >&2; }
start=$SECONDS
base=$("$torch2/bin/python" -c 'import sys; print(sys._base_executable)')
"$base" -m venv "$venv" >&2
site() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
site "$torch2/bin/python" >"$(site "$venv/bin/python")/lspawn-torch2.pth"
"$venv/bin/python" -c 'import torch' || { log "torch from $torch2 does not import in $venv"; exit 1; }
log "installing lightning==$version into $venv (torch from $torch2)"
# --no-deps and Lightning's requirements named here: with torch's own requirements unmet (the
# torch2 venv installs torch --no-deps), pip would otherwise pull ~3.4 GB of CUDA wheels and
# triton to satisfy them. fsspec, typing-extensions and numpy come from the torch2 venv.
"$venv/bin/python" -m pip --disable-pip-version-check -q install --no-compile --no-deps "lightning==$version" \
  "lightning-utilities>=0.15.3,<2" "torchmetrics>0.7,<3" "PyYAML>5.4,<8" "packaging>=23,<27" "tqdm>=4.57,<6" >&2
# pip must not have brought a second torch.
"$venv/bin/python" - "$torch2" <<'PY' >&2
import sys, torch, lightning
assert torch.__file__.startswith(__import__("os").path.realpath(sys.argv[1])) or "/torch2/" in torch.__file__, torch.__file__
print(f"setup-lightning: lightning {lightning.__version__} on torch {torch.__version__} ({torch.__file__})")
PY
touch "$stamp"
log "done in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1))"
echo "$venv"
