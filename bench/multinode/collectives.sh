#!/bin/bash
# collectives.sh BUILD [REPS] — collectives across two hosts made of network namespaces (mn-a
# 10.79.0.1, mn-b 10.79.0.2, a veth pair; bench/multinode/netns_hosts.sh), 2 nodes x 2 ranks:
# lspawn's hierarchical path (shm on each host, gloo between the two leaders) against flat gloo
# (LSPAWN_BACKEND=gloo's path: one gloo ring over all 4 ranks) and Open MPI 4.1.4 (mpirun on mn-a,
# reaching mn-b through an rsh agent; vader inside a host, tcp between them). all_reduce,
# broadcast, all_gather of float32 at 4 KiB, 64 KiB, 1 MiB and 16 MiB per rank; the timing rules
# of bench/collectives (3 warm-ups, an op count for ~BUDGET_MS, the slowest rank's mean). Each
# implementation runs REPS times (alternating), the best time of each point is kept. Prints a
# side-by-side markdown table; writes the rows to $OUT (default /tmp/lspawn-multinode-bench.json).
#   env: BUDGET_MS=300  OUT=...
# Needs root, iproute2, util-linux, openmpi-bin; BUILD with lspawn, lspawn_bench_collectives and
# mpi_bench (-DLSPAWN_BUILD_BENCH=ON).
set -uo pipefail
BUILD=$(cd "${1:?usage: collectives.sh BUILD [REPS]}" && pwd)
REPS=${2:-3}
BUDGET_MS=${BUDGET_MS:-300}
OUT=${OUT:-/tmp/lspawn-multinode-bench.json}
LSPAWN=$BUILD/launcher/lspawn
BENCH=$BUILD/bench/collectives/lspawn_bench_collectives
MPIBENCH=$BUILD/bench/collectives/mpi_bench
for f in "$LSPAWN" "$BENCH" "$MPIBENCH"; do [[ -x $f ]] || { echo "missing $f (build with -DLSPAWN_BUILD_BENCH=ON)" >&2; exit 2; }; done
NET=10.79.0
source "$(dirname "$0")/netns_hosts.sh"
hosts_up
export OMP_NUM_THREADS=1
SIZES=(--min-bytes 4K --max-bytes 16M --step 16)

run_lspawn() {  # REP: one job, both backends (hierarchical = auto, flat gloo)
  local args=(--quiet --nnodes 2 --nprocs 2 --master-addr $NET.1 --master-port 29500)
  (on b "$LSPAWN" "${args[@]}" --node-rank 1 "$BENCH" --backends auto,gloo "${SIZES[@]}" --budget-ms $BUDGET_MS \
     >$WORK/b.out 2>&1) & local pb=$!
  (on a "$LSPAWN" "${args[@]}" --node-rank 0 "$BENCH" --backends auto,gloo "${SIZES[@]}" --budget-ms $BUDGET_MS \
     --label lspawn --json $WORK/lspawn-$1.json >$WORK/a.out 2>&1)
  local ra=$?
  wait $pb; local rb=$?
  [[ $ra == 0 && $rb == 0 ]] || { echo "lspawn failed ($ra $rb)" >&2; cat $WORK/a.out $WORK/b.out >&2; exit 1; }
  grep -q "hierarchical" $WORK/a.out || { echo "lspawn: the group was not hierarchical" >&2; cat $WORK/a.out >&2; exit 1; }
}
run_mpi() {  # REP
  (on a mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 --host $NET.1:2,$NET.2:2 \
     --mca plm_rsh_agent $AGENT --mca btl_tcp_if_include mnet0 --mca oob_tcp_if_include mnet0 \
     "$MPIBENCH" $((16 << 20)) 16 $BUDGET_MS 4096 >$WORK/mpi-$1.jsonl 2>$WORK/mpi.err) \
    || { echo "mpirun failed" >&2; cat $WORK/mpi.err >&2; exit 1; }
}

echo "# $(date -u +%FT%TZ), $(getconf _NPROCESSORS_ONLN) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $REPS reps, budget $BUDGET_MS ms" >&2
for rep in $(seq $REPS); do
  run_lspawn $rep
  run_mpi $rep
  echo "# rep $rep done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
python3 - "$OUT" $WORK/lspawn-*.json $WORK/mpi-*.jsonl <<'PY'
import json, sys
out, files = sys.argv[1], sys.argv[2:]
best = {}
for f in files:
    text = open(f).read().strip()
    rows = json.loads(text) if text.startswith('[') else [json.loads(l) for l in text.splitlines() if l.strip()]
    for r in rows:
        impl = {'hierarchical': 'hierarchical', 'gloo': 'flat gloo', 'mpi': 'Open MPI'}[r['backend']]
        k = (r['op'], r['bytes'], impl)
        if k not in best or r['time_us'] < best[k]['time_us']:
            best[k] = dict(r, impl=impl)
json.dump(sorted(best.values(), key=lambda r: (r['op'], r['bytes'], r['impl'])), open(out, 'w'), indent=1)
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
impls = ['hierarchical', 'flat gloo', 'Open MPI']
print('| op | size/rank | ' + ' | '.join(f'{i} µs (busbw GB/s)' for i in impls) + ' | gloo time / hier | MPI time / hier |')
print('|---|---|' + '---|' * (len(impls) + 2))
for op in ['all_reduce', 'broadcast', 'all_gather']:
    for b in sorted({k[1] for k in best if k[0] == op}):
        r = {i: best.get((op, b, i)) for i in impls}
        cells = [f"{r[i]['time_us']:.0f} ({r[i]['busbw_gbs']:.3f})" if r[i] else '-' for i in impls]
        ratio = lambda x: f"{r[x]['time_us'] / r['hierarchical']['time_us']:.2f}x" if r[x] and r['hierarchical'] else '-'
        print(f"| {op} | {size(b)} | " + ' | '.join(cells) + f" | {ratio('flat gloo')} | {ratio('Open MPI')} |")
PY
