#!/bin/bash
# netns_hello.sh BUILD [REPS] — a 2-node x 2-worker hello_allreduce job across two hosts made of
# network namespaces (mn-a 10.79.0.1, mn-b 10.79.0.2, a veth pair), launch to exit, lspawn
# (one lspawn per host, static rendezvous; exec and forkserver) against Open MPI's mpirun (run
# on mn-a, reaching mn-b through an rsh agent that enters its namespace). Prints a markdown
# table of median (min-max) wall seconds. Needs root, iproute2, util-linux, openmpi-bin.
# The namespaces carry a token unique to the run and are removed on exit.
set -uo pipefail
BUILD=$(cd "${1:?usage: netns_hello.sh BUILD [REPS]}" && pwd)
REPS=${2:-5}
LSPAWN=$BUILD/launcher/lspawn
HELLO=$BUILD/examples/hello_allreduce
NET=10.79.0
source "$(dirname "$0")/netns_hosts.sh"
hosts_up

now() { date +%s.%N; }
export OMP_NUM_THREADS=1

run_lspawn() {  # extra lspawn options...
  local t0 t1
  t0=$(now)
  (on b "$LSPAWN" --quiet --nnodes 2 --node-rank 1 --nprocs 2 --master-addr $NET.1 --master-port 29500 "$@" "$HELLO" >$WORK/b.out 2>&1) &
  local pb=$!
  (on a "$LSPAWN" --quiet --nnodes 2 --node-rank 0 --nprocs 2 --master-addr $NET.1 --master-port 29500 "$@" "$HELLO" >$WORK/a.out 2>&1)
  local ra=$?
  wait $pb; local rb=$?
  t1=$(now)
  [[ $ra == 0 && $rb == 0 ]] || { echo "lspawn failed ($ra $rb)" >&2; cat $WORK/a.out $WORK/b.out >&2; return 1; }
  [[ $(cat $WORK/a.out $WORK/b.out | grep -c "/4: allreduce sum = 10") == 4 ]] || { echo "lspawn: wrong sums" >&2; return 1; }
  awk -v a=$t0 -v b=$t1 'BEGIN { printf "%.3f\n", b - a }'
}
run_mpirun() {
  local t0 t1 r
  t0=$(now)
  (on a mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 --host $NET.1:2,$NET.2:2 \
     --mca plm_rsh_agent $AGENT --mca btl_tcp_if_include mnet0 --mca oob_tcp_if_include mnet0 \
     -x MASTER_ADDR=$NET.1 -x MASTER_PORT=29600 -x GLOO_SOCKET_IFNAME=mnet0 -x OMP_NUM_THREADS \
     "$HELLO" >$WORK/m.out 2>&1)
  r=$?
  t1=$(now)
  [[ $r == 0 ]] || { echo "mpirun failed ($r)" >&2; cat $WORK/m.out >&2; return 1; }
  [[ $(grep -c "/4: allreduce sum = 10" $WORK/m.out) == 4 ]] || { echo "mpirun: wrong sums" >&2; cat $WORK/m.out >&2; return 1; }
  awk -v a=$t0 -v b=$t1 'BEGIN { printf "%.3f\n", b - a }'
}
stats() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) { print "failed"; exit } m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2f (%.2f-%.2f)", m, v[1], v[NR] }'; }

declare -A res
for tool in lspawn lspawn-fs mpirun; do
  : >$WORK/$tool.times
  for _ in $(seq $REPS); do
    case $tool in
      lspawn) run_lspawn >>$WORK/$tool.times ;;
      lspawn-fs) run_lspawn --start-method forkserver >>$WORK/$tool.times ;;
      mpirun) run_mpirun >>$WORK/$tool.times ;;
    esac
  done
  res[$tool]=$(stats <$WORK/$tool.times)
done
echo "hello_allreduce, 2 hosts (network namespaces) x 2 workers, launch to exit, $REPS runs, median (min-max) s"
echo
echo "| lspawn (exec) | lspawn --start-method forkserver | mpirun |"
echo "|---|---|---|"
echo "| ${res[lspawn]} | ${res[lspawn-fs]} | ${res[mpirun]} |"
