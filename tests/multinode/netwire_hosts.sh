# netwire_hosts.sh — sourced: two hosts made of network namespaces whose only link is netwire.py
# (a user-space relay between two TUN devices, with a one-way delay and random loss; netem is
# absent on this kernel). Used by tests/multinode/slow_link_test.sh and bench/faults/slow_links.sh.
#
#   source tests/multinode/netwire_hosts.sh
#   wire_up DELAY LOSS [SEED]   hosts mn-a $WIRE_NET.1 and mn-b $WIRE_NET.2 (interface $WIRE_IF on
#                               each), the relay started
#   on a CMD...                 runs CMD on host a (its netns, hostname mn-a); likewise b. Execs.
#   wire_stats                  the relay's counters so far (its stderr: one line a direction)
#   wire_down                   stops the relay, kills what is left in the hosts, removes them
#   $WIRE_WORK                  a temp dir of wire_up's, removed by wire_down (the caller's trap
#                               must call wire_down; wire_up may follow again)
# Names carry a token unique to each wire_up (parallel runs, and wire_ups in parallel subshells,
# do not clash). Needs root, iproute2,
# nsenter, unshare, /dev/net/tun and python3.
WIRE_PY=${WIRE_PY:-$(command -v /usr/bin/python3 || command -v python3)}
WIRE_SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/netwire.py
WIRE_A= WIRE_B= WIRE_TA= WIRE_TB=
WIRE_NET=${WIRE_NET:-10.76.0}
WIRE_IF=wire0
WIRE_WORK=
WIRE_PID=

# wire_missing: prints what this machine lacks for the wire (empty: nothing).
wire_missing() {
  [[ $(id -u) == 0 ]] || { echo "needs root (network namespaces, TUN devices)"; return; }
  for t in ip nsenter unshare timeout; do command -v $t >/dev/null || { echo "$t not installed"; return; }; done
  [[ -n $WIRE_PY ]] || { echo "no python3"; return; }
  [[ -c /dev/net/tun ]] || { echo "no /dev/net/tun"; return; }
}

wire_up() {  # DELAY LOSS [SEED]
  local tok
  tok=$(printf '%05x%03x' $(( BASHPID & 0xfffff )) $(( SRANDOM & 0xfff )))
  WIRE_A=lspnw-$tok-a WIRE_B=lspnw-$tok-b
  WIRE_TA=nw${tok}a WIRE_TB=nw${tok}b  # TUN names: 11 chars (< 16)
  WIRE_WORK=$(mktemp -d /tmp/lspawn-netwire-XXXXXX)
  ip netns add $WIRE_A && ip netns add $WIRE_B || return 1
  "$WIRE_PY" "$WIRE_SCRIPT" relay --tun-a $WIRE_TA --tun-b $WIRE_TB --delay "$1" --loss "$2" --seed "${3:-1}" \
    >$WIRE_WORK/relay.out 2>$WIRE_WORK/relay.err &
  WIRE_PID=$!
  for _ in $(seq 600); do grep -q '^ready' $WIRE_WORK/relay.out 2>/dev/null && break; sleep 0.05; done  # 30 s: a loaded machine
  grep -q '^ready' $WIRE_WORK/relay.out || { echo "netwire did not start: $(cat $WIRE_WORK/relay.err)" >&2; return 1; }
  ip link set $WIRE_TA netns $WIRE_A && ip link set $WIRE_TB netns $WIRE_B || return 1
  # Both named $WIRE_IF inside their hosts (one GLOO_SOCKET_IFNAME for every rank); the relay's
  # open files stay attached whatever the name.
  ip -n $WIRE_A link set $WIRE_TA name $WIRE_IF && ip -n $WIRE_B link set $WIRE_TB name $WIRE_IF || return 1
  # Point to point: each host's address, and the other's as the peer (a /32 route through the TUN).
  ip -n $WIRE_A addr add $WIRE_NET.1 peer $WIRE_NET.2 dev $WIRE_IF || return 1
  ip -n $WIRE_B addr add $WIRE_NET.2 peer $WIRE_NET.1 dev $WIRE_IF || return 1
  for ns in $WIRE_A $WIRE_B; do
    ip netns exec $ns sysctl -qw net.ipv6.conf.all.disable_ipv6=1  # no router solicitations on the wire
    ip -n $ns link set lo up
  done
  ip -n $WIRE_A link set $WIRE_IF up && ip -n $WIRE_B link set $WIRE_IF up
}

on() {
  local h=$1 ns
  shift
  [[ $h == a ]] && ns=$WIRE_A || ns=$WIRE_B
  exec nsenter --net=/run/netns/$ns unshare --uts sh -c 'hostname "$0" && exec "$@"' "mn-$h" "$@"
}

wire_stats() {
  [[ -n $WIRE_PID ]] && kill -USR1 $WIRE_PID 2>/dev/null && sleep 0.2
  grep -- '->' $WIRE_WORK/relay.err | tail -2
}

wire_down() {
  for ns in $WIRE_A $WIRE_B; do
    pids=$(ip netns pids $ns 2>/dev/null | tr '\n' ' ')
    [[ -n ${pids// /} ]] && kill -KILL $pids 2>/dev/null
  done
  [[ -n $WIRE_PID ]] && { kill $WIRE_PID 2>/dev/null; wait $WIRE_PID 2>/dev/null; }
  WIRE_PID=
  ip netns del $WIRE_A 2>/dev/null
  ip netns del $WIRE_B 2>/dev/null
  [[ -n $WIRE_WORK ]] && rm -rf "$WIRE_WORK"
  WIRE_WORK=
}
