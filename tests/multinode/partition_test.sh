#!/bin/bash
# partition_test.sh LSPAWN HELLO_ALLREDUCE — network partitions in multi-node jobs across three
# hosts made of network namespaces on one bridge (hosts_lib.sh: mn-a 10.79.0.1, the coordinator,
# mn-b .2, mn-c .3), one worker of examples/hello_allreduce per host. A host is cut by taking its
# bridge port down (what it sends and is sent is dropped without a word, as behind a failed switch
# port); b and c alone are cut from each other by blackhole routes, both still reaching a.
#   1. rendezvous: c cut before it starts, healed 1.5 s later: it joins, the job completes
#   1b. rendezvous: c joined, then cut; the job forms while c is cut (its assignment in flight);
#      healed 1.5 s later, within --node-timeout 5: completes
#   2. training, a<->c cut and healed at 9.5 s of --node-timeout 12: completes, nobody lost (the
#      node channel's retransmissions are at most 1 s apart; with TCP's doubled back-off the one
#      after the heal came about 12.6 s after the cut, past the timeout, and c was lost)
#   3. training, c cut for good, static --nnodes 3: a and b exit 123 naming node 2 (mn-c); c exits
#      123 naming node 0 (mn-a), its worker stopped, no all_reduce finished and no new round there
#   4. elastic --nnodes 2:3 --max-restarts 1, c cut for good: a and b go on in a round of 2
#      (all_reduce right, exit 0); c exits 123 naming the coordinator and starts no round alone
#   5. b<->c only, healed after 1 s: every control channel is healthy; the workers' gloo
#      connections retransmit: completes, nobody lost
#   5b. b<->c for good, --hang-timeout 3: no node is lost (every lspawn hears from every other);
#      the coordinator's hang watchdog names the stuck all_reduce, exit 124 everywhere
#   5c. b<->c for good, no --hang-timeout, LSPAWN_PG_TIMEOUT=3: the collective's own timeout ends
#      it: a worker's gloo error is the root cause, exit 1 everywhere
#   6. --hostfile through the remote shell nsrsh.sh (the caller here): c cut and healed within
#      --node-timeout: the caller exits 0; 6b. cut for good: every host names the loss, exit 123
# PARTITION_CASES="2 4" runs those cases alone. After each: nothing left running in any namespace.
# Needs root, iproute2 (bridge, veth), nsenter, unshare, timeout; exits 77 (skipped) without them.
# 67-71 s on the shared 2-core machine (89 s at load average 9): waits for timeouts, little CPU.
set -uo pipefail
LSPAWN=${1:?usage: partition_test.sh LSPAWN HELLO_ALLREDUCE}
HELLO=${2:?usage: partition_test.sh LSPAWN HELLO_ALLREDUCE}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/hosts_lib.sh"
hosts_require
WORK=$(mktemp -d /tmp/lspawn-partition-XXXXXX)
NET=10.79.0
hosts_up $NET a b c

export OMP_NUM_THREADS=1
T0=$(now)
# 30 all_reduces 50 ms apart: about 1.5 s of training, for the cases whose cut heals (the job then
# completes).
TRAIN=("$HELLO" --iters 30 --iter-sleep-ms 50)
# For the cuts that do not heal: the first round trains until the fault ends it, however late the cut
# lands on a loaded machine (a round of 1.5 s could finish first); a restarted round trains 30.
UNTIL_CUT=("$HELLO" --iters 1000000 --iter-sleep-ms 50 --restart-iters 30)
# static HOST NODE_RANK NODE_TIMEOUT [lspawn flags...] -- worker...: one node of a static job of 3.
static() {
  local h=$1 r=$2 nt=$3
  shift 3
  on $h timeout 60 "$LSPAWN" --nnodes 3 --nprocs 1 --grace-period 1 --node-timeout $nt --rdzv-timeout 20 \
    --node-rank $r --master-addr $NET.1 --master-port 29500 "$@"
}
# run_static CASE NODE_TIMEOUT [flags...] -- starts the three nodes (c, b, then a) in the
# background: pids in pa, pb, pc; output in $WORK/CASE{a,b,c}.{out,err}.
run_static() {
  local n=$1 nt=$2
  shift 2
  started $n c static c 2 $nt "$@"
  started $n b static b 1 $nt "$@"
  started $n a static a 0 $nt "$@"
}
# wait_all CASE: the exit codes of a, b, c in ra, rb, rc, and how long after the fault (t0) each
# exited, in sa, sb, sc (from CASE{a,b,c}.end, written by the subshell that started the node).
wait_all() {
  wait $pa; ra=$?
  wait $pb; rb=$?
  wait $pc; rc=$?
  sa=$(secs_between $t0 $WORK/${1}a.end)
  sb=$(secs_between $t0 $WORK/${1}b.end)
  sc=$(secs_between $t0 $WORK/${1}c.end)
}
secs_between() { awk -v a=$1 -v b="$(cat $2 2>/dev/null)" 'BEGIN { printf "%.2f", b - a }'; }
# started CASE HOST CMD...: CMD in the background with CASE's output files, its end time in
# CASE{HOST}.end; the pid in p{HOST}.
started() {
  local n=$1 h=$2
  shift 2
  ( ("$@" >$WORK/$n$h.out 2>$WORK/$n$h.err); r=$?; now >$WORK/$n$h.end; exit $r) &
  eval p$h=\$!
}
# training CASE: waits (up to 30 s) until every host's worker is in its all_reduce loop.
training() {
  local h
  for h in a b c; do until_in $WORK/$1$h.out "training:" 30 || { fail "$1: mn-$h never started training"; return 1; }; done
  sleep 0.5
}
sums_right() {  # CASE WORLD: every host's rank has the right all_reduce sum
  local n=$1 w=$2 sum=$(( $2 * ($2 + 1) / 2 ))
  has $WORK/${n}a.out "[mn-a rank 0] rank 0/$w: allreduce sum = $sum" &&
    has $WORK/${n}b.out "[mn-b rank 1] rank 1/$w: allreduce sum = $sum" &&
    { [[ $w == 2 ]] || has $WORK/${n}c.out "[mn-c rank 2] rank 2/$w: allreduce sum = $sum"; }
}
nobody_lost() { ! grep -qE "lost|timed out" $WORK/$1?.err; }
# The loss of mn-c (by the coordinator's side) and of mn-a (by mn-c), as extended regular
# expressions: silence for --node-timeout, or the kernel's TCP_USER_TIMEOUT (the same length) firing
# first, which reports the last soft error (the neighbour no longer answering ARP) or a time-out.
BROKEN='(nothing received for 3 s \(--node-timeout\)|connection broken \((No route to host|Connection timed out)\))'
LOST_C="root cause: node 2 \(mn-c, $NET.3\) was lost: $BROKEN"
LOST_A="root cause: node 0 \(mn-a, $NET.1\) was lost: $BROKEN"

# elastic HOST [worker...]: one node of an elastic job of 2 to 3 nodes.
elastic() {
  local h=$1
  shift
  on $h timeout 60 "$LSPAWN" --nnodes 2:3 --nprocs 1 --grace-period 1 --node-timeout 3 --rdzv-timeout 20 \
    --rdzv-endpoint $NET.1:29400 --rdzv-id part4 --max-restarts 1 "$@"
}
# hostfile CASE [worker...]: one command for the three hosts, the caller here, the hosts reached through the
# remote shell nsrsh.sh (what ssh is between machines); in the background, its pid in pcall.
export NSRSH_HOSTS="$NET.1=${HOST_NS[a]}=mn-a $NET.2=${HOST_NS[b]}=mn-b $NET.3=${HOST_NS[c]}=mn-c"
printf '%s slots=1\n' $NET.1 $NET.2 $NET.3 >$WORK/hosts
hostfile() {
  local n=$1
  shift
  (($# > 0)) || set -- "${TRAIN[@]}"
  timeout 60 "$LSPAWN" --hostfile $WORK/hosts --rsh "$HERE/nsrsh.sh" --grace-period 1 --node-timeout 3 \
    "$@" >$WORK/$n.out 2>$WORK/$n.err &
  pcall=$!
}

case_1() {
  echo "== [$(stamp)] 1. rendezvous: c cut before it starts, healed 1.5 s later"
  host_cut c
  run_static 1 3 "${TRAIN[@]}"
  t0=$(now)
  until_in $WORK/1a.err "rendezvous: waiting for 2 more nodes" 20
  sleep 1.5
  host_heal c
  wait_all 1
  check "rdzv cut: all three exit 0 (a=$ra b=$rb c=$rc)" test $ra = 0 -a $rb = 0 -a $rc = 0
  check "rdzv cut: every sum right (a world of 3)" sums_right 1 3
  check "rdzv cut: c joined after the heal (the rendezvous took >= 1.5 s)" \
    eval 'grep -qE "rendezvous: 3 nodes joined after ([2-9]|1\.[5-9])" $WORK/1a.err'
  check "rdzv cut: nothing left" nothing_left
}

case_1b() {
  echo "== [$(stamp)] 1b. rendezvous: c joined, then cut; the job forms while it is cut; healed within --node-timeout 5"
  started 1b c static c 2 5 "${TRAIN[@]}"
  started 1b a static a 0 5 "${TRAIN[@]}"
  # c's join message in the coordinator's socket (ss names bytes_received once there are any):
  # the cut must not catch the join itself, only what comes after it
  for _ in $(seq 400); do
    ip netns exec ${HOST_NS[a]} ss -Htni state established "( sport = :29500 and dst $NET.3 )" |
      grep -q bytes_received: && break
    sleep 0.05
  done
  host_cut c
  t0=$(now)
  started 1b b static b 1 5 "${TRAIN[@]}"
  # b's assignment means the job formed, c's assignment sent into the cut; healed 1.5 s after the
  # cut, or 0.3 s after the forming when that came later
  until_in $WORK/1bb.err "rendezvous: node 1 of 3" 20
  sleep 0.3
  sleep $(awk -v a=$t0 -v b=$(now) 'BEGIN { d = 1.5 - (b - a); print (d > 0 ? d : 0) }')
  formed_in_cut=$(grep -c "rendezvous: node 1 of 3" $WORK/1bb.err)
  cut=$(secs_since $t0)
  host_heal c
  wait_all 1b
  check "join cut: the job formed while c was cut off ($cut s)" test "$formed_in_cut" = 1
  check "join cut: all three exit 0 (a=$ra b=$rb c=$rc)" test $ra = 0 -a $rb = 0 -a $rc = 0
  check "join cut: every sum right" sums_right 1b 3
  check "join cut: nobody lost" nobody_lost 1b
  check "join cut: nothing left" nothing_left
}

# kernel_at_least MAJOR MINOR: the running kernel is that release or later.
kernel_at_least() {
  local v major minor
  v=$(uname -r)
  major=${v%%.*}
  minor=${v#*.}
  minor=${minor%%[!0-9]*}
  ((major > $1 || (major == $1 && minor >= $2)))
}

case_2() {
  echo "== [$(stamp)] 2. training: a<->c cut, healed at 9.5 s of --node-timeout 12"
  # One all_reduce, then 10.5 s of "compute" (the cut lands in it), then the broadcast, all_gather
  # and barrier, after the heal. Only the node channels carry data during the cut: each side's
  # heartbeat (1 s apart) is retransmitted at most 1 s apart, so the first to arrive after the heal
  # comes at most about 11.4 s after the last one before the cut. With TCP's doubled back-off the
  # retransmissions came about 6.2-7.2 s after the cut (before the heal), then 12.6-13.6 s: past
  # the timeout, c lost.
  # A kernel before 6.15 refuses TCP_RTO_MAX_MS (the back-off stays doubled): there the heal comes
  # at 4.5 s, within what such a kernel guarantees (about half the timeout; docs/multi-node.md).
  local heal=9.5
  if ! kernel_at_least 6 15; then
    heal=4.5
    echo "   kernel $(uname -r) < 6.15: no TCP_RTO_MAX_MS, the heal comes at $heal s"
  fi
  run_static 2 12 "$HELLO" --iters 1 --iter-sleep-ms 10500
  training 2
  t0=$(now)
  host_cut c
  sleep $heal
  host_heal c
  wait_all 2
  check "heal: all three exit 0 (a=$ra b=$rb c=$rc, $sa s after the cut)" test $ra = 0 -a $rb = 0 -a $rc = 0
  check "heal: every sum right" sums_right 2 3
  check "heal: nobody lost" nobody_lost 2
  check "heal: nothing left" nothing_left
}

case_3() {
  echo "== [$(stamp)] 3. training: c cut for good, static --nnodes 3"
  run_static 3 3 "${UNTIL_CUT[@]}"
  training 3
  t0=$(now)
  host_cut c
  wait_all 3
  check "cut: all three exit 123 (a=$ra in $sa s, b=$rb in $sb s, c=$rc in $sc s)" test $ra = 123 -a $rb = 123 -a $rc = 123
  check "cut: a and b name node 2 (mn-c) lost" eval 'grep -qE "^lspawn: $LOST_C" $WORK/3a.err && grep -qE "^lspawn: $LOST_C" $WORK/3b.err'
  check "cut: c names node 0 (mn-a), the coordinator, lost" grep -qE "^lspawn: $LOST_A" $WORK/3c.err
  check "cut: c's worker stopped by its lspawn" eval 'grep -qE "^lspawn: process 2 \(pid [0-9]+\) terminated by lspawn with SIG(TERM|KILL)" $WORK/3c.err'
  check "cut: no split brain: no all_reduce finished anywhere, no restart or round on c" \
    eval '! grep -q "allreduce sum" $WORK/3?.out && ! grep -qE "restart|round [1-9]" $WORK/3c.err'
  check "cut: stopped by the 3 s node timeout, not by the 60 s timeout (< 20 s)" \
    eval 'elapsed_below $sa 20 && elapsed_below $sb 20 && elapsed_below $sc 20'
  check "cut: nothing left" nothing_left
  host_heal c
}

case_4() {
  echo "== [$(stamp)] 4. elastic --nnodes 2:3 --max-restarts 1: c cut for good; a and b go on"
  started 4 a elastic a "${UNTIL_CUT[@]}"
  until_in $WORK/4a.err "rendezvous: waiting" 20
  started 4 b elastic b "${UNTIL_CUT[@]}"
  until_in $WORK/4a.err "rendezvous: 2 nodes joined" 20  # b before c: c is node 2
  started 4 c elastic c "${UNTIL_CUT[@]}"
  training 4
  t0=$(now)
  host_cut c
  wait_all 4
  check "elastic: a and b exit 0, c 123 (a=$ra in $sa s, b=$rb, c=$rc in $sc s)" test $ra = 0 -a $rb = 0 -a $rc = 123
  check "elastic: a names mn-c lost and restarts the 2 remaining nodes" \
    eval 'has $WORK/4a.err "lost node 2 (mn-c, $NET.3): " && has $WORK/4a.err "restarting the 2 remaining nodes'"'"' workers (--nnodes 2:3, restart 1 of at most 1)"'
  check "elastic: the new round is a world of 2 with the right sum" sums_right 4 2
  check "elastic: c names the coordinator lost and stops its worker" \
    eval 'grep -qE "^lspawn: $LOST_A" $WORK/4c.err && grep -qE "^lspawn: process 2 \(pid [0-9]+\) terminated by lspawn with SIG(TERM|KILL)" $WORK/4c.err'
  check "elastic: no split brain: c finished no all_reduce and started no round of its own" \
    eval '! grep -q "allreduce sum" $WORK/4c.out && ! grep -qE "restart [0-9]|round [1-9]" $WORK/4c.err'
  check "elastic: nothing left" nothing_left
  host_heal c
}

case_5() {
  echo "== [$(stamp)] 5. b<->c only, healed after 1 s"
  run_static 5 3 "${TRAIN[@]}"
  training 5
  t0=$(now)
  hosts_blackhole b c
  sleep 1
  hosts_unblackhole b c
  wait_all 5
  check "b-c heal: all three exit 0 (a=$ra b=$rb c=$rc, $sa s after the cut)" test $ra = 0 -a $rb = 0 -a $rc = 0
  check "b-c heal: every sum right" sums_right 5 3
  check "b-c heal: nobody lost" nobody_lost 5
  check "b-c heal: nothing left" nothing_left
}

# Each of hosts a, b, c's stderr in case $1 has a line matching every ERE after it; else says which host lacks
# which and shows its lspawn lines (a function, not `eval ... || exit 1`: that ended the whole script,
# with no FAIL line and nothing to read).
every_host_err() {
  local c=$1 h re
  shift
  for h in a b c; do
    for re in "$@"; do
      grep -qE -- "$re" "$WORK/$c$h.err" && continue
      echo "  host $h's stderr has no line matching /$re/; its lspawn lines (no backtraces):"
      grep '^lspawn:' "$WORK/$c$h.err" | grep -vE '^lspawn:     (#|\()' | tail -12 | sed 's/^/    /'
      return 1
    done
  done
}

# Ranks 0, 1, 2 on mn-a, mn-b, mn-c each printed "rank R/3: TEXT" into $WORK/FILE.
every_rank_in() {
  local h r=0
  for h in a b c; do
    has "$WORK/$1" "[mn-$h rank $r] rank $r/3: $2" || { echo "  no '[mn-$h rank $r] rank $r/3: $2' in $1"; return 1; }
    r=$((r + 1))
  done
}

case_5b() {
  echo "== [$(stamp)] 5b. b<->c for good, --hang-timeout 3"
  run_static 5b 3 --hang-timeout 3 "${UNTIL_CUT[@]}"
  training 5b
  t0=$(now)
  hosts_blackhole b c
  wait_all 5b
  hosts_unblackhole b c
  check "b-c cut: all three exit 124 (a=$ra in $sa s, b=$rb, c=$rc)" test $ra = 124 -a $rb = 124 -a $rc = 124
  check "b-c cut: no node lost (every control channel healthy)" nobody_lost 5b
  check "b-c cut: every host prints the hang report naming the stuck all_reduce" \
    every_host_err 5b "^lspawn: hang: no rank made progress in its collectives for [0-9.]+ s \(--hang-timeout 3\)" \
      "^lspawn:   waiting: .*in all_reduce #[0-9]+ on group world"
  check "b-c cut: nothing left" nothing_left
}

case_5c() {
  echo "== [$(stamp)] 5c. b<->c for good, no --hang-timeout: LSPAWN_PG_TIMEOUT=3 ends the collective"
  LSPAWN_PG_TIMEOUT=3 run_static 5c 3 "${UNTIL_CUT[@]}"
  training 5c
  t0=$(now)
  hosts_blackhole b c
  wait_all 5c
  hosts_unblackhole b c
  check "b-c pg timeout: all three exit 1 (a=$ra in $sa s, b=$rb, c=$rc)" test $ra = 1 -a $rb = 1 -a $rc = 1
  check "b-c pg timeout: no node lost" nobody_lost 5c
  # The first rank to time out leaves, and a rank still waiting on it may see its connection close before
  # its own 3 s are up (seen under load: host a's "Connection closed by peer"): every host names a worker's
  # gloo error, and at least one of them the 3 s timeout.
  check "b-c pg timeout: a root cause on every host: a worker's gloo error" \
    every_host_err 5c "^lspawn: root cause: process [0-9] " "^lspawn:   error: gloo::IoException: "
  check "b-c pg timeout: the collective ended by the 3 s timeout" \
    grep -qE "^lspawn:   error: gloo::IoException: .*Timed out waiting 3000ms for (send|recv) operation to complete" \
    "$WORK/5ca.err" "$WORK/5cb.err" "$WORK/5cc.err"
  check "b-c pg timeout: nothing left" nothing_left
}

case_6() {
  echo "== [$(stamp)] 6. --hostfile (remote shell nsrsh.sh): c cut, healed within --node-timeout"
  hostfile 6
  until_in $WORK/6.out "[mn-c rank 2] rank 2/3: training:" 30 || fail "hostfile: mn-c never started training"
  sleep 0.5
  t0=$(now)
  host_cut c
  sleep 1
  host_heal c
  wait $pcall; r=$?
  check "hostfile heal: the caller exits 0 ($r)" test $r = 0
  check "hostfile heal: every sum right" every_rank_in 6.out "allreduce sum = 6"
  check "hostfile heal: nobody lost" eval '! grep -qE "lost|timed out" $WORK/6.err'
  check "hostfile heal: nothing left" nothing_left
}

case_6b() {
  echo "== [$(stamp)] 6b. --hostfile: c cut for good"
  hostfile 6b "${UNTIL_CUT[@]}"
  until_in $WORK/6b.out "[mn-c rank 2] rank 2/3: training:" 30 || fail "hostfile: mn-c never started training"
  sleep 0.5
  t0=$(now)
  host_cut c
  wait $pcall; r=$?; s=$(secs_since $t0)
  check "hostfile cut: the caller exits 123 in $s s ($r)" test $r = 123
  check "hostfile cut: a and b name node 2 (mn-c) lost, c the coordinator" \
    eval 'grep -qE "^\[$NET.1\] lspawn: $LOST_C" $WORK/6b.err && grep -qE "^\[$NET.2\] lspawn: $LOST_C" $WORK/6b.err && grep -qE "^\[$NET.3\] lspawn: $LOST_A" $WORK/6b.err'
  check "hostfile cut: no all_reduce finished" eval '! grep -q "allreduce sum" $WORK/6b.out'
  check "hostfile cut: nothing left" nothing_left
  host_heal c
}

for c in ${PARTITION_CASES:-1 1b 2 3 4 5 5b 5c 6 6b}; do
  case_$c
done

echo "$PASSES passed, $FAILS failed ($(stamp))"
if [[ $FAILS != 0 ]]; then
  for f in $WORK/*.err; do echo "---- $f"; grep -v '^lspawn:     #' "$f" | tail -25; done
  exit 1
fi
exit 0
