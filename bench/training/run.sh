#!/usr/bin/env bash
# lspawn DDP vs PyTorch DDP (Debian's torch 1.13 under /usr/bin/python3), MLP 784-1024-1024-10,
# batch 64 per rank, N = 1, 2, 4; then DDPSpawn's fit() → first step vs mp.spawn + DDP.
# Usage: bench/training/run.sh [BUILD_DIR] [STEPS]    (results: JSON lines on stdout)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
steps=${2:-200}
lspawn=$build/launcher/lspawn
bench=$build/bench/training/train_bench
echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg) BLAS: $(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || echo '?')"
for n in 1 2 4; do
  "$lspawn" --nprocs "$n" "$bench" --steps "$steps" 2>/dev/null | grep '^{\|^\[rank 0\] {' | sed 's/^\[rank 0\] //'
  "$lspawn" --nprocs "$n" "$bench" --steps "$steps" --backend shm --hook 2>/dev/null | grep '{' | sed 's/^\[rank 0\] //'
  "$lspawn" --nprocs "$n" /usr/bin/python3 "$root/bench/training/ddp_bench.py" --steps "$steps" 2>/dev/null | grep '{' | sed 's/^\[rank 0\] //'
done
for start in fork spawn forkserver; do
  "$bench" --spawn 2 --start "$start" 2>/dev/null | grep '^{'
done
/usr/bin/python3 "$root/bench/training/ddp_bench.py" --spawn 2 2>/dev/null | grep '^{'
