#!/usr/bin/env bash
# lspawn DDP vs PyTorch DDP, MLP 784-1024-1024-10, batch 64 per rank, N = 1, 2, 4 (rounds
# interleaved); then DDPSpawn's fit() → first step vs mp.spawn + DDP and, when a Lightning venv is
# given, Lightning's ddp_spawn / ddp_fork (bench/training/setup-lightning.sh).
#
# Usage: bench/training/run.sh [BUILD_DIR] [STEPS]    (JSON lines on stdout; full logs in $LOG_DIR)
# Environment:
#   PYTHON      the Python whose torch runs the PyTorch side (default /usr/bin/python3, Debian's
#               torch 1.13; the 2.x line: .deps/torch2/bin/python with BUILD_DIR=build-torch2)
#   ROUNDS      repetitions of the steps/s rounds (default 1); bench/training/table.py keeps the best
#   NPROCS      the N values (default "1 2 4")
#   LIGHTNING   a Lightning venv (bench/training/setup-lightning.sh); empty: Lightning is not run
#   SPAWN_ROUNDS  repetitions of the time-to-first-step runs (default 1)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
steps=${2:-200}
py=${PYTHON:-/usr/bin/python3}
rounds=${ROUNDS:-1}
spawn_rounds=${SPAWN_ROUNDS:-1}
logs=${LOG_DIR:-$(mktemp -d /tmp/lspawn-train-bench-XXXXXX)}
mkdir -p "$logs"
lspawn=$build/launcher/lspawn
bench=$build/bench/training/train_bench
script=$root/bench/training/ddp_bench.py
echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg) BLAS: $(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || echo '?') python: $py build: $build logs: $logs"
run() {  # name, command...
  local name=$1; shift
  timeout 300 "$@" >"$logs/$name.log" 2>&1 || echo "# $name failed (rc $?), see $logs/$name.log"
  grep -h '^{\|^\[rank 0\] {' "$logs/$name.log" | sed 's/^\[rank 0\] //' | sed "s/}\$/, \"round\": \"$name\"}/"
}
for r in $(seq 1 "$rounds"); do
  for n in ${NPROCS:-1 2 4}; do
    run "lspawn-gloo-$n-r$r" "$lspawn" --nprocs "$n" "$bench" --steps "$steps"
    run "lspawn-shmhook-$n-r$r" "$lspawn" --nprocs "$n" "$bench" --steps "$steps" --backend shm --hook
    run "pytorch-$n-r$r" "$lspawn" --nprocs "$n" "$py" "$script" --steps "$steps"
  done
done
for r in $(seq 1 "$spawn_rounds"); do
  for start in fork forkserver spawn; do
    run "ddpspawn-$start-r$r" "$bench" --spawn 2 --start "$start"
  done
  run "mp-spawn-r$r" "$py" "$script" --spawn 2
  if [[ -n ${LIGHTNING:-} ]]; then
    for strategy in ddp_spawn ddp_fork; do
      run "lightning-$strategy-r$r" "$LIGHTNING/bin/python" "$root/bench/training/lightning_bench.py" --nprocs 2 --strategy "$strategy"
    done
  fi
done
