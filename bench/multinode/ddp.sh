#!/bin/bash
# ddp.sh BUILD [REPS] [STEPS] — DDP training across two hosts made of network namespaces (mn-a
# 10.80.0.1, mn-b 10.80.0.2, a veth pair; bench/multinode/netns_hosts.sh), 2 nodes x 2 ranks, the
# model of bench/training (MLP 784-1024-1024-10, 1.86M gradient floats, batch 64 per rank, SGD):
#   lspawn DDP, hierarchical hook  train_bench --backend auto --hook: each bucket through the
#                                  hierarchy (shm on each host, gloo between the two leaders)
#   lspawn DDP, gloo               train_bench --backend gloo: the Reducer on one flat gloo group
#   PyTorch DDP                    bench/training/ddp_bench.py ($PYTHON's torch, gloo), under lspawn
# Every job is started the same way (one lspawn per host, --nnodes 2 --nprocs 2,
# GLOO_SOCKET_IFNAME=mnet0); the three alternate, REPS times each; the best steps/s of each is
# kept. Prints a side-by-side markdown table; the JSON lines go to $OUT
# (default /tmp/lspawn-multinode-ddp.jsonl).
#   env: PYTHON (default /usr/bin/python3: Debian's torch 1.13, with BUILD=build; a 2.x venv's
#        python with a build against that LibTorch), OUT=...
# Needs root, iproute2, util-linux; BUILD with lspawn and train_bench (-DLSPAWN_BUILD_BENCH=ON).
set -uo pipefail
BUILD=$(cd "${1:?usage: ddp.sh BUILD [REPS] [STEPS]}" && pwd)
REPS=${2:-3}
STEPS=${3:-100}
PY=${PYTHON:-/usr/bin/python3}
OUT=${OUT:-/tmp/lspawn-multinode-ddp.jsonl}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LSPAWN=$BUILD/launcher/lspawn
BENCH=$BUILD/bench/training/train_bench
for f in "$LSPAWN" "$BENCH"; do [[ -x $f ]] || { echo "missing $f (build with -DLSPAWN_BUILD_BENCH=ON)" >&2; exit 2; }; done
NET=10.80.0
source "$(dirname "$0")/netns_hosts.sh"
hosts_up
export OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=mnet0
: >"$OUT"

job() {  # NAME CMD...: one job on both hosts; rank 0's JSON line (tagged with NAME) appended to $OUT
  local name=$1; shift
  local args=(--quiet --nnodes 2 --nprocs 2 --master-addr $NET.1 --master-port 29500)
  (on b "$LSPAWN" "${args[@]}" --node-rank 1 "$@" >$WORK/$name.b 2>&1) & local pb=$!
  (on a "$LSPAWN" "${args[@]}" --node-rank 0 "$@" >$WORK/$name.a 2>&1)
  local ra=$?
  wait $pb; local rb=$?
  [[ $ra == 0 && $rb == 0 ]] || { echo "$name failed ($ra $rb)" >&2; cat $WORK/$name.a $WORK/$name.b >&2; exit 1; }
  local line
  line=$(grep -h '^{\|^\[[^]]*rank 0\] {' $WORK/$name.a | sed 's/^\[[^]]*rank 0\] //')
  [[ -n $line ]] || { echo "$name: rank 0 printed no figures" >&2; cat $WORK/$name.a >&2; exit 1; }
  echo "${line%\}}, \"job\": \"$name\"}" >>"$OUT"
}

echo "# $(date -u +%FT%TZ), $(getconf _NPROCESSORS_ONLN) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $REPS reps, $STEPS steps, python $PY" >&2
for rep in $(seq "$REPS"); do
  job hier-$rep "$BENCH" --steps "$STEPS" --backend auto --hook
  grep -q '"path": "hierarchical-hook"' "$OUT" || { echo "the lspawn group was not hierarchical" >&2; tail -1 "$OUT" >&2; exit 1; }
  job gloo-$rep "$BENCH" --steps "$STEPS" --backend gloo
  job torch-$rep "$PY" "$ROOT/bench/training/ddp_bench.py" --steps "$STEPS"
  echo "# rep $rep done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def impl(r):
    if r["impl"] == "pytorch-ddp":
        return f"PyTorch DDP (torch {r.get('torch', '?')}, gloo)"
    return {"hierarchical-hook": "lspawn DDP, hierarchical hook", "gloo": "lspawn DDP, gloo"}[r["path"]]
best = {}
for r in rows:
    k = impl(r)
    if k not in best or r["steps_per_s"] > best[k]["steps_per_s"]:
        best[k] = r
ref = next((v for k, v in best.items() if k.startswith("PyTorch")), None)
print("| 2 hosts x 2 ranks | steps/s per rank (best of reps) | step ms | all-reduce alone ms | vs PyTorch DDP |")
print("|---|---|---|---|---|")
for k, r in best.items():
    ar = r.get("allreduce_ms")
    print(f"| {k} | {r['steps_per_s']:.1f} | {r['step_ms']:.1f} | {ar:.1f} |" if ar is not None else f"| {k} | {r['steps_per_s']:.1f} | {r['step_ms']:.1f} | - |",
          f"{r['steps_per_s'] / ref['steps_per_s']:.2f}x |" if ref else "- |")
PY
