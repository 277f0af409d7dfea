#!/usr/bin/env bash
# lspawn DDP vs PyTorch DDP (Debian's torch 1.13 under /usr/bin/python3), MLP 784-1024-1024-10,
# batch 64 per rank, N = 1, 2, 4; then DDPSpawn's fit() → first step vs mp.spawn + DDP.
# Usage: bench/training/run.sh [BUILD_DIR] [STEPS]    (JSON lines on stdout; full logs in $LOG_DIR)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
steps=${2:-200}
logs=${LOG_DIR:-$(mktemp -d /tmp/lspawn-train-bench-XXXXXX)}
lspawn=$build/launcher/lspawn
bench=$build/bench/training/train_bench
py=$root/bench/training/ddp_bench.py
echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg) BLAS: $(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || echo '?') logs: $logs"
run() {  # name, command...
  local name=$1; shift
  timeout 300 "$@" >"$logs/$name.log" 2>&1 || echo "# $name failed (rc $?), see $logs/$name.log"
  grep -h '{' "$logs/$name.log" | sed 's/^\[rank 0\] //'
}
for n in 1 2 4; do
  run "lspawn-gloo-$n" "$lspawn" --nprocs "$n" "$bench" --steps "$steps"
  run "lspawn-shmhook-$n" "$lspawn" --nprocs "$n" "$bench" --steps "$steps" --backend shm --hook
  run "pytorch-$n" "$lspawn" --nprocs "$n" /usr/bin/python3 "$py" --steps "$steps"
done
for start in fork spawn forkserver; do
  run "ddpspawn-$start" "$bench" --spawn 2 --start "$start"
done
run "mp-spawn" /usr/bin/python3 "$py" --spawn 2
