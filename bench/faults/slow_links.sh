#!/bin/bash
# slow_links.sh BUILD — how far lspawn's default timeouts go on a slow and lossy link (#47).
#
# Sweeps added one-way latency x packet loss across two hosts made of network namespaces whose
# only link is tests/multinode/netwire.py (a user-space relay between two TUN devices: a fixed
# delay, random loss each way, no bandwidth cap, no reordering, no jitter; netem is absent on
# this kernel). At each point a 2-node x 2-worker job of examples/hello_allreduce runs with
# lspawn's defaults (no --node-timeout, --rdzv-timeout or hang flag), and the table says: did it
# complete (exit 0 on both nodes, all_reduce right), how long it took, and if not, which limit
# fired first (node timeout, the nodes' rendezvous timeout, the workers' rendezvous/store, a
# hang, gloo) with its message, or "cap" when the point ran past CAP seconds without any limit
# firing (the bench then kills it).
#
#   bench/faults/slow_links.sh build                                 # the full sweep
#   DELAYS="0.2 1" LOSSES="0.05" CAP=120 bench/faults/slow_links.sh build
# Environment: DELAYS (one-way seconds; "0.2 1 2 5 10"), LOSSES (fractions each way;
# "0.05 0.2 0.4"), ITERS (hello_allreduce --iters; 4), CAP (seconds a point may run; 300),
# JOBS (points run at once, each on a wire of its own; 3: the jobs mostly wait on the wire),
# SEED (the relay's; 47), TORCH_PY (a Python with torch 2.x, for torchrun at the same points;
# /work/main/.deps/torch2/bin/python when there, else torchrun is left out: TORCH_PY= leaves it
# out). torchrun runs bench/faults/allreduce_worker.py (the same all_reduces, in Python) with its
# own defaults: static rendezvous (--master_addr/--master_port), no timeout flags, and
# GLOO_SOCKET_IFNAME (torch's gloo binds to the hostname's address, which mn-a/mn-b lack;
# lspawn's runtime takes the address that routes to the master).
# Prints a markdown table, lspawn's and torchrun's rows side by side. Needs root, iproute2, nsenter, unshare, /dev/net/tun, python3.
set -uo pipefail
BUILD=$(cd "${1:?usage: slow_links.sh BUILD}" && pwd)
LSPAWN=$BUILD/launcher/lspawn
HELLO=$BUILD/examples/hello_allreduce
DELAYS=${DELAYS:-0.2 1 2 5 10}
LOSSES=${LOSSES:-0.05 0.2 0.4}
ITERS=${ITERS:-4} CAP=${CAP:-300} JOBS=${JOBS:-3} SEED=${SEED:-47}
TORCH_PY=${TORCH_PY-/work/main/.deps/torch2/bin/python}
[[ -n $TORCH_PY && -x $TORCH_PY ]] || TORCH_PY=
TOOLS="lspawn${TORCH_PY:+ torchrun}"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$ROOT/tests/multinode/netwire_hosts.sh"
source "$ROOT/tests/multinode/checks.sh"  # nothing_left_in, ns_pids
missing=$(wire_missing)
[[ -z $missing ]] || { echo "slow_links.sh: $missing" >&2; exit 1; }
OUT=$(mktemp -d /tmp/lspawn-slow-links-XXXXXX)
trap 'rm -rf "$OUT"' EXIT
export OMP_NUM_THREADS=1

# classify A.OUT B.OUT: "limit<TAB>message" for the first limit the output names.
classify() {
  local line
  # Each pattern: the limit, then what its message says (lspawn's, the workers').
  while IFS='|' read -r limit pattern; do
    line=$(grep -hE -m1 "$pattern" "$@" 2>/dev/null | head -1)
    [[ -n $line ]] && { printf '%s\t%s\n' "$limit" "$line"; return; }
  done <<'PATTERNS'
node timeout|was lost: nothing received|lost the coordinator|connection broke|lost [a-z-]+ [0-9]*.*node
nodes' rendezvous timeout|rendezvous.*(timed out|did not complete)|exit 122
hang|hang watchdog|has not entered a collective
workers' rendezvous/store|RendezvousError|lost the store|RendezvousTimeout|Socket Timeout|store at .*refused|DistStoreError|DistNetworkError|TCPStore|RendezvousConnectionError|RendezvousClosed
gloo|gloo|Gloo|Connection closed by peer|Timed out waiting|pair
other|error:|root cause
PATTERNS
  printf 'other\t%s\n' "$(grep -hv '^lspawn: \(rendezvous\|starting\|--nnodes\)' "$@" | head -1)"
}

# launch TOOL NODE-RANK: the job's command on one node (lspawn's or torchrun's, defaults).
launch() {
  if [[ $1 == lspawn ]]; then
    "$LSPAWN" --nnodes 2 --nprocs 2 --master-addr $WIRE_NET.1 --master-port 29500 --node-rank $2 "$HELLO" --iters $ITERS
  else
    # torch's gloo takes the address of the hostname (mn-a: none) unless told the interface.
    GLOO_SOCKET_IFNAME=$WIRE_IF "$TORCH_PY" -m torch.distributed.run --nnodes 2 --nproc_per_node 2 --master_addr $WIRE_NET.1 --master_port 29500 \
      --node_rank $2 "$ROOT/bench/faults/allreduce_worker.py" --iters $ITERS
  fi
}

# point TOOL DELAY LOSS: one job across a fresh wire; prints tool, delay, loss, result, seconds,
# drops, limit, what was left, message, separated by \037 (empty fields survive read).
point() {
  local tool=$1 delay=$2 loss=$3 t0 t1 ra rb took result limit msg
  trap wire_down EXIT
  wire_up "$delay" "$loss" "$SEED" || { printf '%s\037%s\037%s\037no wire\n' "$tool" "$delay" "$loss"; return; }
  local dir=$WIRE_WORK
  t0=$(date +%s.%N)
  (on b timeout -k 5 $CAP bash -c "$(declare -f launch); $(declare -p LSPAWN HELLO TORCH_PY ITERS WIRE_NET WIRE_IF ROOT); launch $tool 1" \
     >$dir/b.out 2>&1) & local pb=$!
  (on a timeout -k 5 $CAP bash -c "$(declare -f launch); $(declare -p LSPAWN HELLO TORCH_PY ITERS WIRE_NET WIRE_IF ROOT); launch $tool 0" \
     >$dir/a.out 2>&1) & local pa=$!
  wait $pa; ra=$?; wait $pb; rb=$?
  t1=$(date +%s.%N)
  took=$(awk -v a=$t0 -v b=$t1 'BEGIN { printf "%.1f", b - a }')
  local sums
  sums=$(cat $dir/a.out $dir/b.out | grep -c "/4: allreduce sum = 10")
  if [[ $ra == 0 && $rb == 0 && $sums == 4 ]]; then
    result=yes limit= msg=
  elif [[ $ra == 124 || $rb == 124 || $ra == 137 || $rb == 137 ]]; then
    result="no (exit $ra/$rb)" limit="cap (${CAP} s): no limit fired"
    msg=$(grep -hE "rendezvous:|starting|allreduce" $dir/a.out $dir/b.out | tail -1)
  else
    result="no (exit $ra/$rb)"
    IFS=$'\t' read -r limit msg < <(classify $dir/a.out $dir/b.out)
  fi
  local drops
  drops=$(wire_stats | awk -F'[ ,]+' '{ for (i = 1; i <= NF; i++) { if ($i == "read") r += $(i+1); if ($i == "dropped") d += $(i+1) } } END { printf "%d/%d", d, r }')
  # What is left in the two hosts once both nodes' commands have ended (their lspawns exited, or
  # the cap's SIGTERM, then SIGKILL 5 s later, ended them): waited for up to 5 s.
  local left=nothing pids
  if ! nothing_left_in 5 $WIRE_A $WIRE_B >/dev/null; then
    pids=$(ns_pids $WIRE_A $WIRE_B)
    left="$(echo $pids | wc -w) processes: $(ps -o comm= -p ${pids// /,} 2>/dev/null | sort | uniq -c | awk '{ printf "%s%s x%s", s, $2, $1; s = ", " }')"
  fi
  [[ -n ${KEEP:-} ]] && { mkdir -p "$KEEP"; cp $dir/a.out "$KEEP/$tool-$delay-$loss.a.out"; cp $dir/b.out "$KEEP/$tool-$delay-$loss.b.out"; }
  wire_down
  msg=${msg//|/\\|}
  printf '%s\037%s\037%s\037%s\037%s\037%s\037%s\037%s\037%s\n' "$tool" "$delay" "$loss" "$result" "$took" "$drops" "$limit" "$left" "${msg:0:200}"
}

n=0
for delay in $DELAYS; do
  for loss in $LOSSES; do
    for tool in $TOOLS; do
      (point $tool "$delay" "$loss" >"$OUT/$(printf '%03d' $n).row") &
      n=$((n + 1))
      while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n; done
    done
  done
done
wait

echo "2 nodes x 2 workers, $ITERS all_reduces, across netwire.py; defaults; a point is stopped after $CAP s; $JOBS points at once"
[[ -z $TORCH_PY ]] && echo "(torchrun left out: no TORCH_PY)"
echo
echo "| one-way delay (s) | loss each way | launcher | completed | wall (s) | packets dropped/relayed | first limit to fire | left in the hosts after | its message |"
echo "|---|---|---|---|---|---|---|---|---|"
for f in "$OUT"/*.row; do
  IFS=$'\037' read -r tool d l r t p lim left m <"$f"
  echo "| $d | $l | $tool | $r | $t | $p | ${lim:-none} | ${left:-?} | ${m:+\`$m\`} |"
done
