#!/bin/bash
# ssh_test.sh LSPAWN TEST_WORKER [HELLO_ALLREDUCE] — `lspawn --hostfile` through a real OpenSSH:
# Debian's sshd started here in each of two hosts made of network namespaces (mn-a 10.79.0.1 and
# mn-b 10.79.0.2, a veth pair), with a host key and a user key made here (ssh-keygen) in a temp
# dir, its own sshd_config and the client's own ssh_config (--rsh "ssh -F <tmp>/ssh_config"):
# /etc/ssh and ~/.ssh are never read or written (checked). The caller runs on mn-a, as on a
# cluster's first node, and reaches both hosts (itself included) over ssh.
#   1. start: 2 hosts x 2 workers (tests/e2e's worker: each rank's environment); with
#      HELLO_ALLREDUCE also examples/hello_allreduce's all_reduce across both hosts
#   2. Ctrl-C (SIGINT to the caller): forwarded, every host stops, the caller exits 130
#   3. the caller and its ssh clients SIGKILLed: each host's lspawn sees its ssh channel close and
#      stops its workers; nothing left within a few seconds
#  3b. mn-b's lspawn SIGKILLed: its ssh exits 255; the host named, node 0 names the lost node
#   4. an unreachable host (no answer to ARP): named, exit 255, the other hosts stopped (the
#      remote shell from LSPAWN_RSH, not --rsh)
#   5. a host that refuses the key (sshd: another authorized_keys): named with ssh's
#      "Permission denied (publickey)" and lspawn's hint, exit 255, no wait
#   6. no prompt may hang the job (lspawn's ssh defaults, docs/multi-node.md): an unknown host key
#      and a password-only host, with no terminal (setsid, stdin /dev/null) and with one (script(1):
#      ssh's prompt would read /dev/tty from a background process group and stop); each ends at once
#      with a named error. The control: the same with the user's -o BatchMode=no hangs under a
#      terminal (what the default prevents)
#   7. a black-holed host (its SYN silently dropped): ends after ssh's ConnectTimeout, named; the
#      user's own -o ConnectTimeout=2 wins over lspawn's 10
# After each: nothing left in either namespace but the two sshd listeners (no session, no
# lspawn, no worker). Needs root, iproute2, nsenter, unshare, timeout, Debian's openssh-server and
# openssh-client (scripts/install-deps.sh); exits 77 (skipped) without them.
set -uo pipefail
LSPAWN=${1:?usage: ssh_test.sh LSPAWN TEST_WORKER [HELLO_ALLREDUCE]}
WORKER=${2:?usage: ssh_test.sh LSPAWN TEST_WORKER [HELLO_ALLREDUCE]}
HELLO=${3:-}
LSPAWN=$(readlink -f "$LSPAWN") WORKER=$(readlink -f "$WORKER")   # the hosts run them from their login's home
[[ -n $HELLO ]] && HELLO=$(readlink -f "$HELLO")
SSHD=/usr/sbin/sshd  # sshd re-executes itself: an absolute path
[[ $(id -u) == 0 ]] || { echo "SKIP: needs root (network namespaces, sshd)"; exit 77; }
for t in ip nsenter unshare timeout setsid ssh ssh-keygen; do
  command -v $t >/dev/null || { echo "SKIP: $t not installed"; exit 77; }
done
[[ -x $SSHD ]] || { echo "SKIP: $SSHD not installed (openssh-server)"; exit 77; }

TOK=$(printf '%05x%03x' $(( $$ & 0xfffff )) $(( RANDOM & 0xfff )))
A=lspsh-$TOK-a B=lspsh-$TOK-b VA=ls${TOK}a VB=ls${TOK}b   # veth names: 11 chars (< 16)
NET=10.79.0
WORK=$(mktemp -d /tmp/lspawn-ssh-XXXXXX)
source "$(dirname "$0")/checks.sh"
SSHD_PIDS=()

etc_ssh_state() { ls -la --time-style=+%s /etc/ssh 2>&1; }
HOME_SSH=$(getent passwd "$(id -un)" | cut -d: -f6)/.ssh
home_ssh_state() { ls -la --time-style=+%s "$HOME_SSH" 2>&1; }
ETC_BEFORE=$(etc_ssh_state)
HOME_BEFORE=$(home_ssh_state)

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
# Step 7's black hole: mn-a routes 10.79.1.0/24 through mn-b, which forwards and silently drops it.
ip -n $A route add 10.79.1.0/24 via $NET.2
ip -n $B route add blackhole 10.79.1.0/24
nsenter --net=/run/netns/$B sh -c 'echo 1 >/proc/sys/net/ipv4/ip_forward'

# on HOST CMD...: CMD on host a or b (its netns, hostname mn-a / mn-b); execs, so $! is CMD's pid.
on() {
  local h=$1 ns
  shift
  [[ $h == a ]] && ns=$A || ns=$B
  exec nsenter --net=/run/netns/$ns unshare --uts sh -c 'hostname "$0" && exec "$@"' "mn-$h" "$@"
}
# Nothing of the job may be left in either namespace (up to SECS, default 5): no ssh session
# ("sshd: root@notty"), no lspawn, no worker; the sshd listeners run on.
nothing_left() { KEEP_PIDS=("${SSHD_PIDS[@]}"); nothing_left_in "${1:-5}" $A $B; }

# ---- keys, sshd and ssh configuration, all in $WORK
ssh-keygen -q -t ed25519 -N '' -C lspawn-test-host -f $WORK/host_key
ssh-keygen -q -t ed25519 -N '' -C lspawn-test-user -f $WORK/id
ssh-keygen -q -t ed25519 -N '' -C lspawn-test-other -f $WORK/other
cp $WORK/id.pub $WORK/authorized_keys
cp $WORK/other.pub $WORK/authorized_keys.other   # port 2222: not the user's key
: >$WORK/known_hosts.empty
hostkey=$(cut -d' ' -f1,2 $WORK/host_key.pub)
echo "$NET.1,$NET.2,[$NET.2]:2222,[$NET.2]:2223 $hostkey" >$WORK/known_hosts
cat >$WORK/sshd_config <<EOF
# the test's sshd (tests/multinode/ssh_test.sh): 22 accepts the test's key; 2222 accepts only
# another key; 2223 only a password
Port 22
Port 2222
Port 2223
HostKey $WORK/host_key
AuthorizedKeysFile $WORK/authorized_keys
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
X11Forwarding no
PrintMotd no
PrintLastLog no
LogLevel VERBOSE
Match LocalPort 2222
  AuthorizedKeysFile $WORK/authorized_keys.other
Match LocalPort 2223
  PubkeyAuthentication no
  PasswordAuthentication yes
  PermitRootLogin yes
EOF
cat >$WORK/ssh_config <<EOF
# the test's ssh client: its own key and known_hosts, nothing of ~/.ssh or /etc/ssh (-F)
Host stranger
  HostName $NET.2
  UserKnownHostsFile $WORK/known_hosts.empty
Host refuser
  HostName $NET.2
  Port 2222
Host pwonly
  HostName $NET.2
  Port 2223
Host *
  User root
  IdentityFile $WORK/id
  IdentitiesOnly yes
  UserKnownHostsFile $WORK/known_hosts
  GlobalKnownHostsFile /dev/null
  UpdateHostKeys no
EOF
chmod 600 $WORK/ssh_config
# sshd wants its privilege-separation directory (the init script makes it at boot).
[[ -d /run/sshd ]] || mkdir -p -m 755 /run/sshd
$SSHD -t -f $WORK/sshd_config || { fail "sshd refuses the test's configuration"; exit 1; }
for h in a b; do
  (on $h $SSHD -D -e -f $WORK/sshd_config -o PidFile=$WORK/sshd-$h.pid 2>$WORK/sshd-$h.log) &
  SSHD_PIDS+=($!)
done
listening() { nsenter --net=/run/netns/$1 ss -Hltn 'sport = :22' 2>/dev/null | grep -q LISTEN; }
for _ in $(seq 100); do listening $A && listening $B && break; sleep 0.05; done
check "sshd listens on both hosts" eval 'listening $A && listening $B'

RSH="ssh -F $WORK/ssh_config"
printf '%s slots=2\n%s slots=2\n' $NET.1 $NET.2 >$WORK/hosts
export OMP_NUM_THREADS=1
# caller SECS ARGS...: the caller on mn-a, no terminal (a new session), stdin /dev/null, ended by
# timeout(1) after SECS. Execs (run it in a subshell).
caller() { local t=$1; shift; on a timeout $t setsid "$LSPAWN" "$@" </dev/null; }

echo "== [$(stamp)] 1. --hostfile through ssh: 2 hosts x 2 workers"
(caller 60 --hostfile $WORK/hosts --rsh "$RSH" --grace-period 1 "$WORKER" env >$WORK/1.out 2>$WORK/1.err)
r=$?
check "start: the caller exits 0 ($r)" test $r = 0
check "start: lspawn ran ssh with its defaults (-T -x BatchMode=yes ConnectTimeout=10)" \
  has $WORK/1.err "through 'ssh -F $WORK/ssh_config -T -x -o BatchMode=yes -o ConnectTimeout=10'"
for r in 0 1 2 3; do
  h=$([[ $r -lt 2 ]] && echo a || echo b)
  check "start: rank $r ran on mn-$h in a world of 4, node $(( r / 2 )), master $NET.1" eval \
    'has $WORK/1.out "[mn-$h rank $r] RANK=$r" && has $WORK/1.out "[mn-$h rank $r] WORLD_SIZE=4" && has $WORK/1.out "[mn-$h rank $r] GROUP_RANK=$(( r / 2 ))" && has $WORK/1.out "[mn-$h rank $r] MASTER_ADDR=$NET.1"'
done
check "start: one run id on both hosts" eval '[[ $(grep -o "TORCHELASTIC_RUN_ID=.*" $WORK/1.out | sort -u | wc -l) == 1 ]]'
check "start: lspawn's own lines of each host carry the host" eval 'grep -q "^\[$NET.1\] lspawn: " $WORK/1.err && grep -q "^\[$NET.2\] lspawn: " $WORK/1.err'
check "start: one job secret on both hosts (no warning, nothing refused)" eval '! grep -qE "not authenticated|refused" $WORK/1.err $WORK/1.out'
check "start: both hosts' logins went through sshd with the test's key" eval 'grep -q "Accepted publickey for root" $WORK/sshd-a.log && grep -q "Accepted publickey for root" $WORK/sshd-b.log'
check "start: nothing left" nothing_left
if [[ -n $HELLO ]]; then
  (caller 60 --hostfile $WORK/hosts --rsh "$RSH" --grace-period 1 "$HELLO" >$WORK/1h.out 2>$WORK/1h.err)
  r=$?
  check "start: hello_allreduce across both hosts exits 0 ($r)" test $r = 0
  check "start: every rank's all_reduce is right" eval 'has $WORK/1h.out "[mn-a rank 0] rank 0/4: allreduce sum = 10" && has $WORK/1h.out "[mn-a rank 1] rank 1/4: allreduce sum = 10" && has $WORK/1h.out "[mn-b rank 2] rank 2/4: allreduce sum = 10" && has $WORK/1h.out "[mn-b rank 3] rank 3/4: allreduce sum = 10"'
  check "start: hello_allreduce: nothing left" nothing_left
fi

# A job whose 4 workers wait for a signal (tests/e2e's worker: no rank 99 exits).
start_waiting() {  # OUT_PREFIX
  (on a "$LSPAWN" --hostfile $WORK/hosts --rsh "$RSH" --grace-period 1 "$WORKER" exit-rank 99 0 \
     </dev/null >$WORK/$1.out 2>$WORK/$1.err) &
  pc=$!  # the caller's pid (on execs)
  until_in $WORK/$1.out "ready" 30 4 || fail "$1: the 4 workers never became ready"
}

echo "== [$(stamp)] 2. Ctrl-C: SIGINT to the caller is forwarded; every host stops; exit 130"
start_waiting 2
t0=$(date +%s.%N)
kill -INT $pc
wait $pc
r=$?
s=$(secs_since $t0)
check "ctrl-c: the caller exits 130 (128 + SIGINT, docs/exit-codes.md) ($r, in $s s)" test $r = 130
check "ctrl-c: the caller forwarded it" has $WORK/2.err "lspawn: SIGINT: forwarded to every host"
check "ctrl-c: both hosts' lspawn stopped on the forwarded SIGINT" eval 'grep -q "^\[$NET.1\] lspawn: .*SIGINT" $WORK/2.err && grep -q "^\[$NET.2\] lspawn: .*SIGINT" $WORK/2.err'
check "ctrl-c: stopped within the grace period, not by the caller's SIGKILL (${s} s < 8 s)" elapsed_below $s 8
check "ctrl-c: nothing left" nothing_left

echo "== [$(stamp)] 3. the caller and its ssh clients SIGKILLed: each host sees its channel close"
start_waiting 3
kids=$(cat /proc/$pc/task/*/children 2>/dev/null)
check "kill: the caller runs one ssh per host ($(echo $kids | wc -w))" test "$(echo $kids | wc -w)" = 2
t0=$(date +%s.%N)
kill -KILL $pc $kids
wait $pc 2>/dev/null
nothing_left 10; ok=$?
check "kill: nothing left on either host after $(secs_since $t0) s (sshd closed each channel; each lspawn stopped its workers)" test $ok = 0

echo "== [$(stamp)] 3b. mn-b's lspawn SIGKILLed: ssh exits 255 (sshd's exit-signal); named, the job stopped"
start_waiting 3b
lb=$(ip netns pids $B | while read -r p; do [[ $(cat /proc/$p/comm 2>/dev/null) == lspawn ]] && echo $p; done | head -1)
kill -KILL $lb
wait $pc
r=$?
check "host lspawn killed: the caller exits 255 ($r)" test $r = 255
check "host lspawn killed: named as a failure after lspawn had started there" \
  has $WORK/3b.err "lspawn: host $NET.2: the remote shell 'ssh' failed (exit 255) after lspawn had started there"
check "host lspawn killed: node 0 names node 1 lost" has $WORK/3b.err "[$NET.1] lspawn: root cause: node 1 (mn-b, $NET.2) was lost"
check "host lspawn killed: nothing left" nothing_left

echo "== [$(stamp)] 4. an unreachable third host: named, exit 255, the others stopped"
cp $WORK/hosts $WORK/hosts4 && echo "$NET.9 slots=2" >>$WORK/hosts4
t0=$(date +%s.%N)
# The remote shell from LSPAWN_RSH this time (the same defaults added)
(LSPAWN_RSH=$RSH caller 60 --hostfile $WORK/hosts4 --grace-period 1 "$WORKER" exit-rank 99 0 >$WORK/4.out 2>$WORK/4.err)
r=$?
check "unreachable: the caller exits 255 ($r, in $(secs_since $t0) s)" test $r = 255
check "unreachable: the host is named with ssh's message" has $WORK/4.err "lspawn: host $NET.9: the remote shell 'ssh' failed (exit 255) before lspawn ran there: ssh: connect to host $NET.9 port 22: No route to host; stopping the other hosts"
check "unreachable: LSPAWN_RSH's ssh got the defaults" has $WORK/4.err "through 'ssh -F $WORK/ssh_config -T -x -o BatchMode=yes -o ConnectTimeout=10'"
check "unreachable: nothing left on the reachable hosts" nothing_left

# fails_fast CASE HOSTFILE_LINE2 RSH EXPECT_TEXT...: a job on mn-a and one failing host ends at
# once (< 10 s, bounded by timeout 30) with exit 255, the failing host and each EXPECT_TEXT in
# the caller's stderr, and nothing left. With no terminal.
fails_fast() {
  local c=$1 host=$2 rsh=$3 t0 r s
  shift 3
  printf '%s slots=2\n%s slots=2\n' $NET.1 $host >$WORK/hosts-$c
  t0=$(date +%s.%N)
  (caller 30 --hostfile $WORK/hosts-$c --rsh "$rsh" --grace-period 1 "$WORKER" exit-rank 99 0 >$WORK/$c.out 2>$WORK/$c.err)
  r=$?
  s=$(secs_since $t0)
  check "$c: the caller exits 255 at once, no prompt ($r, in $s s < 10 s)" eval 'test $r = 255 && elapsed_below $s 10'
  check "$c: host $host named: the remote shell failed" has $WORK/$c.err "lspawn: host $host: the remote shell 'ssh' failed (exit 255) before lspawn ran there: "
  for text in "$@"; do check "$c: says '$text'" has $WORK/$c.err "$text"; done
  check "$c: nothing left" nothing_left
}

echo "== [$(stamp)] 5. a host that refuses the key"
fails_fast refused refuser "$RSH" "Permission denied (publickey)." "lspawn: host refuser: ssh may not ask for a password or passphrase (lspawn runs it with BatchMode=yes)"

echo "== [$(stamp)] 6. no prompt hangs the job: an unknown host key, a password-only host"
fails_fast unknown-key stranger "$RSH" "Host key verification failed." "lspawn: host stranger: the host's key is not in known_hosts"
check "unknown-key: the key was not written anywhere" eval '[[ ! -s $WORK/known_hosts.empty ]]'
fails_fast password pwonly "$RSH" "Permission denied (password)." "ssh may not ask for a password"
# Under a terminal, as a user at a prompt: ssh's question would read /dev/tty from the remote
# shell's own (background) process group.
if command -v script >/dev/null; then
  with_tty() {  # OUT HOST RSH SECS: the caller on mn-a with a terminal of its own (script(1)),
                # the terminal's output in OUT.out, lspawn's stderr in OUT.err; at most SECS
    printf '%s slots=2\n%s slots=2\n' $NET.1 $2 >$WORK/hosts-$1
    printf '%q ' "$LSPAWN" --hostfile $WORK/hosts-$1 --rsh "$3" --grace-period 1 "$WORKER" exit-rank 99 0 >$WORK/$1.cmd
    (on a timeout -k 1 $4 script -qefc "$(cat $WORK/$1.cmd) 2>$WORK/$1.err" /dev/null </dev/null >$WORK/$1.out 2>&1)
  }
  for host in stranger pwonly; do
    t0=$(date +%s.%N)
    with_tty tty-$host $host "$RSH" 8
    r=$?
    s=$(secs_since $t0)
    check "tty $host: with a terminal, the caller still exits 255 at once ($r, in $s s < 6 s)" eval 'test $r = 255 && elapsed_below $s 6'
    check "tty $host: the host is named" has $WORK/tty-$host.err "lspawn: host $host: the remote shell 'ssh' failed (exit 255)"
    check "tty $host: nothing left" nothing_left
  done
  # The control: the user's own BatchMode=no wins over lspawn's default, and ssh's prompt then
  # hangs the job until timeout(1) ends it. Without the default every job would.
  with_tty tty-control pwonly "$RSH -o BatchMode=no" 4 &
  pt=$!
  stopped=""
  for _ in $(seq 70); do  # ssh stopped (state T) in mn-a: its prompt's tcsetattr/read from a background group
    for p in $(ip netns pids $A); do
      [[ $(cat /proc/$p/comm 2>/dev/null) == ssh && $(cut -d' ' -f3 /proc/$p/stat 2>/dev/null) == T ]] && stopped=$p
    done
    [[ -n $stopped ]] && break
    sleep 0.05
  done
  wait $pt
  r=$?
  check "tty control: with -o BatchMode=no, ssh's password prompt stops it on the terminal (SIGTTOU/SIGTTIN)" test -n "$stopped"
  check "tty control: and the job hangs until timeout ends it (124, or 137 when its TERM is not enough: $r)" \
    eval '[[ $r == 124 || $r == 137 ]]'
  check "tty control: lspawn did not add BatchMode=yes after the user's BatchMode=no" \
    eval '! grep -q "BatchMode=yes" $WORK/tty-control.err'
  for ns in $A $B; do  # the hung job: what timeout(1) left (its ssh, stopped on SIGTTIN; host 0's lspawn)
    for p in $(ip netns pids $ns); do
      [[ " ${SSHD_PIDS[*]} " == *" $p "* ]] || kill -KILL $p 2>/dev/null
    done
  done
  nothing_left >/dev/null
else
  echo "(no script(1): the terminal cases are skipped)"
fi

echo "== [$(stamp)] 7. a black-holed host: ssh's ConnectTimeout, named; the user's own value wins"
fails_fast blackhole 10.79.1.9 "$RSH -o ConnectTimeout=2" "ssh: connect to host 10.79.1.9 port 22: Connection timed out" \
  "lspawn: host 10.79.1.9: " 
check "blackhole: ssh was given the user's ConnectTimeout=2 and not lspawn's 10" eval \
  'has $WORK/blackhole.err "-o ConnectTimeout=2 -T -x -o BatchMode=yes'"'"'" && ! has $WORK/blackhole.err "ConnectTimeout=10"'

check "/etc/ssh untouched" eval '[[ "$(etc_ssh_state)" == "$ETC_BEFORE" ]]'
check "$HOME_SSH untouched" eval '[[ "$(home_ssh_state)" == "$HOME_BEFORE" ]]'
check "sshd listeners still up (the cases' checks counted on them)" eval 'kill -0 ${SSHD_PIDS[0]} && kill -0 ${SSHD_PIDS[1]}'

echo "$PASSES passed, $FAILS failed ($(stamp))"
if [[ $FAILS != 0 ]]; then
  for f in $WORK/*.err $WORK/tty-*.out; do echo "---- $f"; cat "$f"; done
  for f in $WORK/sshd-*.log; do echo "---- $f"; tail -25 "$f"; done
  exit 1
fi
exit 0
