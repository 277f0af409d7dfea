#!/usr/bin/env bash
# Runs, in one go, the same collectives sweep with lspawn (shm and gloo backends, under the
# `lspawn` launcher), torch.distributed (gloo, /usr/bin/python3) and Open MPI (mpi_bench.c), then
# prints a side-by-side table with ratios and writes the merged JSON and a bus-bandwidth plot.
#
#   bench/collectives/run.sh [BUILD_DIR] [OUT_DIR]
#     BUILD_DIR  a configured+built tree (default: build); needs lspawn, lspawn_bench_collectives,
#                and mpi_bench (built when mpicc exists)
#     OUT_DIR    where collectives-bench.json and busbw.png go (default: results/<today>-collectives,
#                results/README.md)
#   env: NPROCS="2 4"  MAX_BYTES=67108864  STEP=4  BUDGET_MS=300  OPS=all_reduce,broadcast,all_gather
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=${2:-$root/results/$(date -u +%F)-collectives}
mkdir -p "$out"
NPROCS=${NPROCS:-"2 4"}
MAX_BYTES=${MAX_BYTES:-67108864}
STEP=${STEP:-4}
BUDGET_MS=${BUDGET_MS:-300}
OPS=${OPS:-all_reduce,broadcast,all_gather}
PY=/usr/bin/python3   # Debian's python with torch 1.13 (python3 on PATH may lack torch)

launcher=$build/launcher/lspawn
bench=$build/bench/collectives/lspawn_bench_collectives
mpibench=$build/bench/collectives/mpi_bench
[[ -x $launcher && -x $bench ]] || { echo "run.sh: build lspawn and lspawn_bench_collectives in $build first" >&2; exit 2; }
tmp=$(mktemp -d /tmp/lspawn-collbench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), nprocs: $NPROCS, max $MAX_BYTES B"
for n in $NPROCS; do
  echo "## lspawn, $n ranks"
  "$launcher" --nprocs "$n" --quiet "$bench" --ops "$OPS" --max-bytes "$MAX_BYTES" --step "$STEP" \
    --budget-ms "$BUDGET_MS" --json "$tmp/lspawn-$n.json"

  echo "## torch.distributed (gloo), $n ranks"
  port=$(free_port)
  pids=()
  for ((r = 0; r < n; r++)); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
      "$PY" "$here/torch_dist_bench.py" --ops "$OPS" --max-bytes "$MAX_BYTES" --step "$STEP" \
      --budget-ms "$BUDGET_MS" > "$tmp/torch-$n.rank$r.jsonl" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  cat "$tmp/torch-$n.rank0.jsonl" > "$tmp/torch-$n.jsonl"
  rm -f "$tmp"/torch-$n.rank*.jsonl

  if [[ -x $mpibench ]]; then
    echo "## Open MPI, $n ranks"
    mpirun --allow-run-as-root --oversubscribe -np "$n" "$mpibench" "$MAX_BYTES" "$STEP" "$BUDGET_MS" > "$tmp/mpi-$n.jsonl"
  else
    echo "## Open MPI: $mpibench not built (mpicc missing?), skipped"
  fi
done
"$PY" "$here/compare.py" --json "$out/collectives-bench.json" --plot "$out/busbw.png" "$tmp"/*.json*
