#!/usr/bin/env bash
# The cost of lspawn's always-on collective recording (docs/hang-diagnosis.md, docs/benchmarks.md):
#  1. the recorder alone: ns per enter+complete pair (what every collective adds), and a c10d
#     backend's whole record of one op (lspawn_bench_recorded_backend: enter, future callback, complete);
#  2. a 4-byte shm all_reduce between 2 ranks, with recording and without (the ranks started by
#     this script with the env contract, LSPAWN_STATUS_DIR set or not), alternated 5 times;
#  3. the same for a 4-byte all_reduce on World::pg, c10d's gloo process group (the c10d backend's
#     record: runtime/recorded_backend.hpp, a future callback per op).
#
#   bench/status/run.sh [BUILD_DIR]     (BUILD_DIR configured with -DLSPAWN_BUILD_BENCH=ON and
#                                         built: lspawn_bench_status_recorder, lspawn_bench_collectives)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
rec=$build/bench/status/lspawn_bench_status_recorder
coll=$build/bench/collectives/lspawn_bench_collectives
echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
"$rec"
[[ -x $build/bench/status/lspawn_bench_recorded_backend ]] && "$build/bench/status/lspawn_bench_recorded_backend"
[[ -x $coll ]] || { echo "(no $coll: skipping the all_reduce comparison)"; exit 0; }
tmp=$(mktemp -d /tmp/lspawn-statusbench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
one() {  # $1: on|off, $2: backend → prints the 4-byte all_reduce time in µs (rank 0's line)
  local port; port=$(free_port)
  local pids=()
  for r in 0 1; do
    local extra=()
    [[ $1 == on ]] && extra=(LSPAWN_STATUS_DIR="$tmp")
    env RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "${extra[@]}" "$coll" --ops all_reduce --backends "$2" --min-bytes 4 --max-bytes 4 --budget-ms 1000 \
      --json "$tmp/$1-$r.json" > "$tmp/$1-$r.out" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  /usr/bin/python3 - "$tmp/$1-0.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
pts = d["points"] if isinstance(d, dict) and "points" in d else d
for p in (pts if isinstance(pts, list) else []):
    if p.get("op") == "all_reduce":
        print(p.get("time_us", p.get("us", p)))
        break
PY
}
for backend in shm c10d; do
  for i in 1 2 3 4 5; do
    echo "all_reduce 4 B $backend, 2 ranks: recording on $(one on $backend) µs, off $(one off $backend) µs"
  done
done
