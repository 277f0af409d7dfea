#!/bin/bash
# netns_test.sh LSPAWN HELLO_ALLREDUCE [COLLECTIVES_WORKER] — a multi-node job across two hosts, each a network
# namespace made here (hosts mn-a 10.78.0.1 and mn-b 10.78.0.2, joined by a veth pair), 2 nodes x
# 2 workers of examples/hello_allreduce:
#   1. static rendezvous (--node-rank, --master-addr/--master-port) with LSPAWN_JOB_SECRET shared
#      by the nodes: all_reduce correct, output prefixed "[mn-b rank 3]", nothing refused
#   2. --rdzv-endpoint without --node-rank: node ranks assigned, ranks contiguous per node
#   3. rank 3 (on mn-b) throws: both lspawns report the same root cause and exit 1
#   (4-6 run under --start-method forkserver: one LibTorch load per node, and that start
#   method across nodes)
#   4. mn-b's lspawn SIGKILLed: mn-a exits 123 in bounded time, naming node 1 (mn-b)
#   5. mn-b's link down: both exit 123 in bounded time, each naming the other
#   6. --max-restarts 2 with rank 3 throwing on attempt 0 only (--start-method forkserver): the
#      group restarts once and all_reduce is correct on attempt 1 (store keys of attempt 0 are
#      under another prefix)
#   8. elastic --nnodes 1:2: mn-a runs alone, mn-b joins later: a new round (not a restart) of
#      4 ranks across both hosts, all_reduce correct
#   9. elastic --nnodes 1:2 with both: mn-b's link goes down: mn-a restarts alone (a world of
#      2, all_reduce correct, exit 0); mn-b loses the coordinator (exit 123)
#  10. IPv6: 1. with --master-addr an IPv6 address of mn-a (job secret included), and 2. with
#      --rdzv-endpoint [ADDR]:PORT
#  11. one command for both hosts, the caller here and the hosts reached through a remote shell
#      (nsrsh.sh, as ssh): --hostfile (output of both, host prefixes, one secret), --hosts and
#      SIGTERM (forwarded; the secret on no command line), the caller SIGKILLed (nothing left), an
#      unreachable host (named, exit 255, the others stopped), a failing rank (one root cause)
# After each: nothing left running in either namespace. The namespaces and veth names carry a
# token unique to this run (parallel ctest runs do not clash); everything is removed on exit.
# Needs root, iproute2, nsenter, unshare, timeout; exits 77 (skipped) without them.
set -uo pipefail
LSPAWN=${1:?usage: netns_test.sh LSPAWN HELLO_ALLREDUCE}
HELLO=${2:?usage: netns_test.sh LSPAWN HELLO_ALLREDUCE}
COLLWORKER=${3:-}
[[ $(id -u) == 0 ]] || { echo "SKIP: needs root (network namespaces)"; exit 77; }
for t in ip nsenter unshare timeout; do
  command -v $t >/dev/null || { echo "SKIP: $t not installed"; exit 77; }
done

TOK=$(printf '%05x%03x' $(( $$ & 0xfffff )) $(( RANDOM & 0xfff )))
A=lspmn-$TOK-a B=lspmn-$TOK-b VA=lv${TOK}a VB=lv${TOK}b   # veth names: 11 chars (< 16)
NET=10.78.0
NET6=fd78:${TOK:0:4}:${TOK:4:4}   # the IPv6 prefix of step 10 (fd78:<token>::/64)
WORK=$(mktemp -d /tmp/lspawn-netns-XXXXXX)
source "$(dirname "$0")/checks.sh"

cleanup() {
  for ns in $A $B; do
    pids=$(ip netns pids $ns 2>/dev/null | tr '\n' ' ')
    [[ -n ${pids// /} ]] && kill -KILL $pids 2>/dev/null
  done
  ip netns del $A 2>/dev/null
  ip netns del $B 2>/dev/null
  ip link del $VA 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

ip netns add $A && ip netns add $B || { echo "SKIP: cannot create network namespaces"; exit 77; }
ip link add $VA type veth peer name $VB || { echo "SKIP: no veth support"; exit 77; }
ip link set $VA netns $A && ip link set $VB netns $B
ip -n $A addr add $NET.1/24 dev $VA && ip -n $B addr add $NET.2/24 dev $VB
ip -n $A link set lo up && ip -n $B link set lo up
ip -n $A link set $VA up && ip -n $B link set $VB up
# Waits (up to 5 s) for both ends of the veth pair to be up.
links_up() {
  for _ in $(seq 100); do
    ip -n $A link show $VA | grep -q LOWER_UP && ip -n $B link show $VB | grep -q LOWER_UP && return 0
    sleep 0.05
  done
  return 1
}
links_up

# on HOST CMD...: CMD on host a or b (its netns, hostname mn-a / mn-b); execs, so $! is CMD's pid.
on() {
  local h=$1 ns
  shift
  [[ $h == a ]] && ns=$A || ns=$B
  exec nsenter --net=/run/netns/$ns unshare --uts sh -c 'hostname "$0" && exec "$@"' "mn-$h" "$@"
}
# Nothing of the job may be left in either namespace.
nothing_left() { nothing_left_in 5 $A $B; }

export OMP_NUM_THREADS=1
COMMON=(--nnodes 2 --nprocs 2 --grace-period 1)

T0=$(now)
echo "== 1. static rendezvous, all_reduce, with a job secret shared by the nodes"
# The records and gloo's connections across the two hosts are authenticated (docs/security.md).
SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
(on b timeout 60 env LSPAWN_JOB_SECRET=$SECRET "$LSPAWN" "${COMMON[@]}" --node-rank 1 --master-addr $NET.1 --master-port 29500 "$HELLO" \
   >$WORK/1b.out 2>$WORK/1b.err) & pb=$!
(on a timeout 60 env LSPAWN_JOB_SECRET=$SECRET "$LSPAWN" "${COMMON[@]}" --node-rank 0 --master-addr $NET.1 --master-port 29500 "$HELLO" \
   >$WORK/1a.out 2>$WORK/1a.err) & pa=$!
wait $pa; ra=$?; wait $pb; rb=$?
check "static: both nodes exit 0 (a=$ra b=$rb)" test $ra = 0 -a $rb = 0
check "static: ranks 0,1 on mn-a with the right sum" eval 'has $WORK/1a.out "[mn-a rank 0] rank 0/4: allreduce sum = 10" && has $WORK/1a.out "[mn-a rank 1] rank 1/4: allreduce sum = 10"'
check "static: ranks 2,3 on mn-b with the right sum" eval 'has $WORK/1b.out "[mn-b rank 2] rank 2/4: allreduce sum = 10" && has $WORK/1b.out "[mn-b rank 3] rank 3/4: allreduce sum = 10"'
check "static: records and gloo's connections authenticated (no warning, nothing refused)" eval '! grep -qE "not authenticated|refused" $WORK/1a.err $WORK/1b.err $WORK/1a.out $WORK/1b.out'
check "static: the secret is never printed" eval '! grep -qF "$SECRET" $WORK/1a.err $WORK/1b.err $WORK/1a.out $WORK/1b.out'
check "static: nothing left" nothing_left
[[ $FAILS == 0 ]] || { cat $WORK/1a.err $WORK/1b.err; }

echo "== [$(stamp)] 2. --rdzv-endpoint, node ranks assigned"
(on b timeout 60 "$LSPAWN" "${COMMON[@]}" --rdzv-endpoint $NET.1:29400 --rdzv-id job2 "$HELLO" \
   >$WORK/2b.out 2>$WORK/2b.err) & pb=$!
sleep 0.2  # mn-b first: it waits for the host of the endpoint
(on a timeout 60 "$LSPAWN" "${COMMON[@]}" --rdzv-endpoint $NET.1:29400 --rdzv-id job2 "$HELLO" \
   >$WORK/2a.out 2>$WORK/2a.err) & pa=$!
wait $pa; ra=$?; wait $pb; rb=$?
check "rdzv: both nodes exit 0 (a=$ra b=$rb)" test $ra = 0 -a $rb = 0
check "rdzv: mn-a (the endpoint's host) is node 0: ranks 0,1" eval 'has $WORK/2a.out "[mn-a rank 0] rank 0/4: allreduce sum = 10" && has $WORK/2a.out "[mn-a rank 1] rank 1/4"'
check "rdzv: mn-b is node 1: ranks 2,3" eval 'has $WORK/2b.out "[mn-b rank 2] rank 2/4: allreduce sum = 10" && has $WORK/2b.out "[mn-b rank 3] rank 3/4"'
check "rdzv: run id job2 on both" eval 'has $WORK/2a.err "run id job2" && has $WORK/2b.err "run id job2"'
check "rdzv: nothing left" nothing_left

echo "== [$(stamp)] 3. rank 3 on mn-b throws: one root cause on both nodes"
(on b timeout 60 "$LSPAWN" "${COMMON[@]}" --node-rank 1 --master-addr $NET.1 --master-port 29500 "$HELLO" --throw-rank 3 \
   >$WORK/3b.out 2>$WORK/3b.err) & pb=$!
(on a timeout 60 "$LSPAWN" "${COMMON[@]}" --node-rank 0 --master-addr $NET.1 --master-port 29500 "$HELLO" --throw-rank 3 \
   >$WORK/3a.out 2>$WORK/3a.err) & pa=$!
wait $pa; ra=$?; wait $pb; rb=$?
check "failure: both exit 1 (a=$ra b=$rb)" test $ra = 1 -a $rb = 1
# The root cause is rank 3 either way; when node 0's stop (for rank 1's consequent failure) reaches
# rank 3 while it is still exiting, the report says so (docs/error-reports.md) and counts exit code 1.
# Step 6 reads its report the same way.
R3="process 3 (terminated with exit code 1|raised std::runtime_error and was stopped by lspawn with SIGTERM while exiting)"
root_block() { sed -n '/^lspawn: root cause:/,/^lspawn:   on node/p' "$1" | grep -v '^lspawn:     '; }
for h in a b; do
  check "failure: mn-$h names rank 3 on mn-b as the root cause" eval \
    'grep -qE "^lspawn: root cause: $R3" $WORK/3$h.err && has $WORK/3$h.err "rank 3 of 4, pid" && has $WORK/3$h.err "host mn-b" && has $WORK/3$h.err "error: std::runtime_error: rank 3 throws on purpose"'
done
check "failure: the same report on both nodes" eval 'diff <(root_block $WORK/3a.err) <(root_block $WORK/3b.err) >/dev/null && [[ -n $(root_block $WORK/3a.err) ]]'
check "failure: nothing left" nothing_left

echo "== [$(stamp)] 4. mn-b's lspawn is SIGKILLed"
(on b timeout 60 "$LSPAWN" "${COMMON[@]}" --node-rank 1 --master-addr $NET.1 --master-port 29500 --node-timeout 2 --start-method forkserver "$HELLO" --hang-rank 0 \
   >$WORK/4b.out 2>$WORK/4b.err) & pb=$!
(on a timeout 60 "$LSPAWN" "${COMMON[@]}" --node-rank 0 --master-addr $NET.1 --master-port 29500 --node-timeout 2 --start-method forkserver "$HELLO" --hang-rank 0 \
   >$WORK/4a.out 2>$WORK/4a.err) & pa=$!
until_in $WORK/4a.err "hanging on purpose" 40 || fail "kill: rank 0 never started hanging"
sleep 0.3
lb=$(ip netns pids $B | while read -r p; do [[ $(cat /proc/$p/comm 2>/dev/null) == lspawn ]] && echo $p; done | head -1)
t0=$(date +%s.%N)
kill -KILL $lb
wait $pa; ra=$?; t1=$(date +%s.%N)
wait $pb
secs=$(awk -v a=$t0 -v b=$t1 'BEGIN { printf "%.2f", b - a }')
check "kill: mn-a exits 123 (got $ra) in $secs s" test $ra = 123
check "kill: mn-a names node 1 (mn-b)" has $WORK/4a.err "root cause: node 1 (mn-b, $NET.2) was lost"
# The bound rules out the alternative (mn-a left to its 60 s timeout); it measures no speed
# (a loaded 2-core machine may be slow to notice a closed connection).
check "kill: mn-a stopped by the loss, not by its 60 s timeout ($secs s < 20 s)" elapsed_below $secs 20
check "kill: nothing left" nothing_left

echo "== [$(stamp)] 5. mn-b's link goes down"
(on b timeout 60 "$LSPAWN" "${COMMON[@]}" --node-rank 1 --master-addr $NET.1 --master-port 29500 --node-timeout 2 --start-method forkserver "$HELLO" --hang-rank 0 \
   >$WORK/5b.out 2>$WORK/5b.err) & pb=$!
(on a timeout 60 "$LSPAWN" "${COMMON[@]}" --node-rank 0 --master-addr $NET.1 --master-port 29500 --node-timeout 2 --start-method forkserver "$HELLO" --hang-rank 0 \
   >$WORK/5a.out 2>$WORK/5a.err) & pa=$!
until_in $WORK/5a.err "hanging on purpose" 40 || fail "linkdown: rank 0 never started hanging"
sleep 0.3
t0=$(date +%s.%N)
ip -n $B link set $VB down
wait $pa; ra=$?; t1=$(date +%s.%N)
wait $pb; rb=$?; t2=$(date +%s.%N)
sa=$(awk -v a=$t0 -v b=$t1 'BEGIN { printf "%.2f", b - a }')
sb=$(awk -v a=$t0 -v b=$t2 'BEGIN { printf "%.2f", b - a }')
check "linkdown: both exit 123 (a=$ra in $sa s, b=$rb in $sb s)" test $ra = 123 -a $rb = 123
check "linkdown: mn-a names node 1 (mn-b)" has $WORK/5a.err "root cause: node 1 (mn-b, $NET.2) was lost"
check "linkdown: mn-b names node 0 (mn-a)" has $WORK/5b.err "root cause: node 0 (mn-a, $NET.1) was lost"
check "linkdown: both stopped by the 2 s node timeout, not by their 60 s timeout or TCP's (< 20 s)" eval 'elapsed_below $sa 20 && elapsed_below $sb 20'
check "linkdown: nothing left" nothing_left
ip -n $B link set $VB up
links_up

echo "== [$(stamp)] 6. --max-restarts 2, rank 3 throws on attempt 0 only (forkserver)"
(on b timeout 60 "$LSPAWN" "${COMMON[@]}" --node-rank 1 --master-addr $NET.1 --master-port 29500 --max-restarts 2 \
   --start-method forkserver "$HELLO" --throw-rank 3 --fail-on-attempt 0 >$WORK/6b.out 2>$WORK/6b.err) & pb=$!
(on a timeout 60 "$LSPAWN" "${COMMON[@]}" --node-rank 0 --master-addr $NET.1 --master-port 29500 --max-restarts 2 \
   --start-method forkserver "$HELLO" --throw-rank 3 --fail-on-attempt 0 >$WORK/6a.out 2>$WORK/6a.err) & pa=$!
wait $pa; ra=$?; wait $pb; rb=$?
check "restart: both nodes exit 0 on attempt 1 (a=$ra b=$rb)" test $ra = 0 -a $rb = 0
# As in 3.: rank 3 may still be exiting when the stop reaches it (slow exits, e.g. under ASan).
check "restart: attempt 0's failure was rank 3 on mn-b, on both nodes" eval 'grep -qE "attempt 0: root cause: $R3\$" $WORK/6a.err && grep -qE "attempt 0:   rank 3 of 4, pid [0-9]+, host mn-b," $WORK/6a.err && grep -qE "attempt 0 failed \($R3 on node 1 \(mn-b\)\)" $WORK/6b.err'
check "restart: both nodes restarted once" eval 'has $WORK/6a.err "restart 1 of 2: starting 2 workers" && has $WORK/6b.err "restart 1 of 2: starting 2 workers" && ! has $WORK/6a.err "restart 2 of 2"'
check "restart: all_reduce correct on attempt 1 on every rank" eval 'has $WORK/6a.out "[mn-a rank 0] rank 0/4: allreduce sum = 10" && has $WORK/6b.out "[mn-b rank 3] rank 3/4: allreduce sum = 10"'
check "restart: nothing left" nothing_left

# Elastic (--nnodes 1:2): rank 0 hangs in round 0 only (--fail-on-attempt 0), so a round after
# the first runs all_reduce to the end.
ELASTIC=(--nnodes 1:2 --nprocs 2 --grace-period 1 --rdzv-endpoint $NET.1:29400 --node-timeout 2
         --rdzv-conf last_call_timeout=0.5)
echo "== [$(stamp)] 8. elastic: mn-a alone, then mn-b joins: round 1 spans both hosts"
(on a timeout 60 "$LSPAWN" "${ELASTIC[@]}" --max-restarts 0 "$HELLO" --hang-rank 0 --fail-on-attempt 0 \
   >$WORK/8a.out 2>$WORK/8a.err) & pa=$!
until_in $WORK/8a.err "hanging on purpose" 40 || fail "elastic join: mn-a's round 0 never started"
(on b timeout 60 "$LSPAWN" "${ELASTIC[@]}" --max-restarts 0 "$HELLO" --hang-rank 0 --fail-on-attempt 0 \
   >$WORK/8b.out 2>$WORK/8b.err) & pb=$!
wait $pa; ra=$?; wait $pb; rb=$?
check "elastic join: both nodes exit 0 (a=$ra b=$rb)" test $ra = 0 -a $rb = 0
check "elastic join: mn-a admitted mn-b in a new round, not a restart" eval 'has $WORK/8a.err "a new node, mn-b ($NET.2), joined the job (--nnodes 1:2)" && has $WORK/8a.err "round 1: starting 2 workers (node 0 of 2)" && ! has $WORK/8a.err "restart"'
check "elastic join: round 1's all_reduce is right on every rank of both hosts" eval 'has $WORK/8a.out "[mn-a rank 0] rank 0/4: allreduce sum = 10" && has $WORK/8a.out "[mn-a rank 1] rank 1/4: allreduce sum = 10" && has $WORK/8b.out "[mn-b rank 2] rank 2/4: allreduce sum = 10" && has $WORK/8b.out "[mn-b rank 3] rank 3/4: allreduce sum = 10"'
check "elastic join: nothing left" nothing_left

echo "== [$(stamp)] 9. elastic: mn-b's link goes down: mn-a goes on alone"
(on a timeout 60 "$LSPAWN" "${ELASTIC[@]}" --max-restarts 1 "$HELLO" --hang-rank 0 --fail-on-attempt 0 \
   >$WORK/9a.out 2>$WORK/9a.err) & pa=$!
(on b timeout 60 "$LSPAWN" "${ELASTIC[@]}" --max-restarts 1 "$HELLO" --hang-rank 0 --fail-on-attempt 0 \
   >$WORK/9b.out 2>$WORK/9b.err) & pb=$!
until_in $WORK/9a.err "hanging on purpose" 40 || fail "elastic loss: rank 0 never started hanging"
until_in $WORK/9b.err "starting 2 workers" 40 || fail "elastic loss: mn-b never started its workers"
sleep 0.3
ip -n $B link set $VB down
wait $pa; ra=$?; wait $pb; rb=$?
check "elastic loss: mn-a exits 0 after a round alone (got $ra), mn-b 123 (got $rb)" test $ra = 0 -a $rb = 123
check "elastic loss: mn-a names mn-b as lost and restarts alone" eval 'has $WORK/9a.err "node 1 (mn-b, $NET.2) was lost" && has $WORK/9a.err "restarting the 1 remaining node'"'"'s workers (--nnodes 1:2, restart 1 of at most 1)"'
check "elastic loss: mn-a's round 1 is a world of 2 with the right sum" eval 'has $WORK/9a.out "[mn-a rank 0] rank 0/2: allreduce sum = 3" && has $WORK/9a.out "[mn-a rank 1] rank 1/2: allreduce sum = 3"'
check "elastic loss: mn-b names mn-a as lost" has $WORK/9b.err "root cause: node 0 (mn-a, $NET.1) was lost"
check "elastic loss: nothing left" nothing_left
ip -n $B link set $VB up
links_up

echo "== [$(stamp)] 10. IPv6: --master-addr and --rdzv-endpoint [ADDR]:PORT on an IPv6-only address"
# The veth pair gets unique-local IPv6 addresses as well (nodad: usable at once); every address a
# node is told is one of them, so the nodes' channel, the store and gloo's connections run over IPv6.
ip -n $A addr add $NET6::1/64 dev $VA nodad && ip -n $B addr add $NET6::2/64 dev $VB nodad
(on b timeout 60 env LSPAWN_JOB_SECRET=$SECRET "$LSPAWN" "${COMMON[@]}" --node-rank 1 --master-addr $NET6::1 --master-port 29500 "$HELLO" \
   >$WORK/10b.out 2>$WORK/10b.err) & pb=$!
(on a timeout 60 env LSPAWN_JOB_SECRET=$SECRET "$LSPAWN" "${COMMON[@]}" --node-rank 0 --master-addr $NET6::1 --master-port 29500 "$HELLO" \
   >$WORK/10a.out 2>$WORK/10a.err) & pa=$!
wait $pa; ra=$?; wait $pb; rb=$?
check "ipv6 static: both nodes exit 0 (a=$ra b=$rb)" test $ra = 0 -a $rb = 0
check "ipv6 static: every rank's sum is right" eval 'has $WORK/10a.out "[mn-a rank 0] rank 0/4: allreduce sum = 10" && has $WORK/10b.out "[mn-b rank 3] rank 3/4: allreduce sum = 10"'
check "ipv6 static: nothing refused, nothing left" eval '! grep -qE "not authenticated|refused" $WORK/10a.err $WORK/10b.err && nothing_left'
(on b timeout 60 "$LSPAWN" "${COMMON[@]}" --rdzv-endpoint "[$NET6::1]:29400" --rdzv-id job10 "$HELLO" \
   >$WORK/10rb.out 2>$WORK/10rb.err) & pb=$!
sleep 0.2
(on a timeout 60 "$LSPAWN" "${COMMON[@]}" --rdzv-endpoint "[$NET6::1]:29400" --rdzv-id job10 "$HELLO" \
   >$WORK/10ra.out 2>$WORK/10ra.err) & pa=$!
wait $pa; ra=$?; wait $pb; rb=$?
check "ipv6 rdzv: both nodes exit 0 (a=$ra b=$rb)" test $ra = 0 -a $rb = 0
check "ipv6 rdzv: mn-a (the endpoint's host) is node 0, mn-b node 1, sums right" eval 'has $WORK/10ra.out "[mn-a rank 0] rank 0/4: allreduce sum = 10" && has $WORK/10rb.out "[mn-b rank 3] rank 3/4: allreduce sum = 10"'
check "ipv6 rdzv: nothing left" nothing_left

echo "== [$(stamp)] 11. --hostfile: one command starts both hosts through a remote shell (nsrsh.sh)"
# The caller runs here, in the test's own namespace; the hosts are reached only through the
# remote shell, as with ssh. The job secret comes from the caller's environment in 11b so that
# the test can look for it on every command line.
NSRSH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/nsrsh.sh
export NSRSH_HOSTS="$NET.1=$A=mn-a $NET.2=$B=mn-b"
printf '# the two hosts of this test\n%s slots=2\n%s slots=2   # mn-b\n' $NET.1 $NET.2 >$WORK/hosts
timeout 60 "$LSPAWN" --hostfile $WORK/hosts --rsh "$NSRSH" --grace-period 1 "$HELLO" >$WORK/11.out 2>$WORK/11.err
r=$?
check "hostfile: the caller exits 0 ($r)" test $r = 0
check "hostfile: every rank's lines on the caller's console, with their host" eval 'has $WORK/11.out "[mn-a rank 0] rank 0/4: allreduce sum = 10" && has $WORK/11.out "[mn-a rank 1] rank 1/4: allreduce sum = 10" && has $WORK/11.out "[mn-b rank 2] rank 2/4: allreduce sum = 10" && has $WORK/11.out "[mn-b rank 3] rank 3/4: allreduce sum = 10"'
check "hostfile: lspawn's own lines of each host carry the host" eval 'grep -q "^\[$NET.1\] lspawn: " $WORK/11.err && grep -q "^\[$NET.2\] lspawn: " $WORK/11.err'
check "hostfile: one job secret on both hosts (no warning, nothing refused)" eval '! grep -qE "not authenticated|refused" $WORK/11.err $WORK/11.out'
check "hostfile: nothing left" nothing_left

echo "== [$(stamp)] 11b. --hosts: SIGTERM to the caller stops every host; the secret is on no command line"
LSPAWN_JOB_SECRET=$SECRET "$LSPAWN" --hosts $NET.1:2,$NET.2:2 --rsh "$NSRSH" --grace-period 1 "$HELLO" --hang-rank 0 \
  >$WORK/11b.out 2>$WORK/11b.err &
pc=$!
until_in $WORK/11b.err "hanging on purpose" 40 || fail "hosts: rank 0 never started hanging"
printf '%s\n' "$SECRET" >$WORK/secret.pattern  # in a file: on grep's own command line it would match
on_cmdline=$(grep -lFf $WORK/secret.pattern /proc/[0-9]*/cmdline 2>/dev/null | tr '\n' ' ')
check "hosts: the job secret is on no process's command line (${on_cmdline:-none})" test -z "$on_cmdline"
kill -TERM $pc
wait $pc
r=$?
check "hosts: the caller exits 143 after SIGTERM ($r)" test $r = 143
check "hosts: both hosts were stopped by the forwarded SIGTERM" eval 'grep -q "^\[$NET.1\] lspawn: .*SIGTERM" $WORK/11b.err && grep -q "^\[$NET.2\] lspawn: .*SIGTERM" $WORK/11b.err'
check "hosts: nothing left" nothing_left

echo "== [$(stamp)] 11c. --hostfile: the caller SIGKILLed: every host stops its workers"
"$LSPAWN" --hostfile $WORK/hosts --rsh "$NSRSH" --grace-period 1 "$HELLO" --hang-rank 0 >$WORK/11c.out 2>$WORK/11c.err &
pc=$!
until_in $WORK/11c.err "hanging on purpose" 40 || fail "kill caller: rank 0 never started hanging"
kill -KILL $pc
wait $pc 2>/dev/null
check "kill caller: nothing left on either host" nothing_left

echo "== [$(stamp)] 11d. --hostfile with an unreachable third host: named, the others stopped"
cp $WORK/hosts $WORK/hosts3 && echo "$NET.9 slots=2" >>$WORK/hosts3
timeout 60 "$LSPAWN" --hostfile $WORK/hosts3 --rsh "$NSRSH" --grace-period 1 "$HELLO" >$WORK/11d.out 2>$WORK/11d.err
r=$?
check "unreachable: the caller exits 255 ($r)" test $r = 255
check "unreachable: the host is named, with the remote shell's message" has $WORK/11d.err "lspawn: host $NET.9: the remote shell '$NSRSH' failed (exit 255) before lspawn ran there: ssh: connect to host $NET.9 port 22: No route to host; stopping the other hosts"
check "unreachable: nothing left on the reachable hosts" nothing_left

echo "== [$(stamp)] 11e. --hostfile: rank 3 on mn-b throws: one root cause, the caller exits 1"
timeout 60 "$LSPAWN" --hostfile $WORK/hosts --rsh "$NSRSH" --grace-period 1 "$HELLO" --throw-rank 3 >$WORK/11e.out 2>$WORK/11e.err
r=$?
check "failure: the caller exits 1 ($r)" test $r = 1
check "failure: both hosts name rank 3 on mn-b" eval 'grep -qE "^\[$NET.1\] lspawn: root cause: $R3" $WORK/11e.err && grep -qE "^\[$NET.2\] lspawn: root cause: $R3" $WORK/11e.err && has $WORK/11e.err "host mn-b"'
check "failure: nothing left" nothing_left

if [[ -n $COLLWORKER ]]; then
  echo "== [$(stamp)] 7. lspawn::Group across hosts: hierarchical all_reduce, broadcast, all_gather"
  run7() {  # HOST NODE_RANK
    on $1 env LSPAWN_TEST_FROM_WORLD=1 LSPAWN_TEST_EXPECT_BACKEND=hierarchical LSPAWN_TEST_TIMEOUT_MS=30000 \
      timeout 60 "$LSPAWN" "${COMMON[@]}" --node-rank $2 --master-addr $NET.1 --master-port 29500 "$COLLWORKER" sum auto
  }
  (run7 b 1 >$WORK/7b.out 2>$WORK/7b.err) & pb=$!
  (run7 a 0 >$WORK/7a.out 2>$WORK/7a.err) & pa=$!
  wait $pa; ra=$?; wait $pb; rb=$?
  check "hierarchical: both nodes exit 0 (a=$ra b=$rb)" test $ra = 0 -a $rb = 0
  check "hierarchical: right sums on mn-a" eval 'has $WORK/7a.out "[mn-a rank 0] rank 0/4: hierarchical all_reduce sum = 10" && has $WORK/7a.out "[mn-a rank 1] rank 1/4: hierarchical all_reduce sum = 10"'
  check "hierarchical: right sums on mn-b" eval 'has $WORK/7b.out "[mn-b rank 2] rank 2/4: hierarchical all_reduce sum = 10" && has $WORK/7b.out "[mn-b rank 3] rank 3/4: hierarchical all_reduce sum = 10"'
  check "hierarchical: nothing left" nothing_left
fi

echo "$PASSES passed, $FAILS failed ($(stamp))"
if [[ $FAILS != 0 ]]; then
  for f in $WORK/*.err; do echo "---- $f"; tail -30 "$f"; done
  exit 1
fi
exit 0
