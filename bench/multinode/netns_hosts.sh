# netns_hosts.sh — sourced by the bench/multinode scripts: two hosts made of network namespaces
# joined by a veth pair, both interfaces named mnet0 (one GLOO_SOCKET_IFNAME / btl_tcp_if_include
# for every rank), an rsh agent that lets mpirun on host a start processes on host b, and cleanup.
#
#   NET=10.79.0; source bench/multinode/netns_hosts.sh; hosts_up
#   on a CMD...        runs CMD on host a (netns + hostname mn-a); likewise b
#   $AGENT             mpirun --mca plm_rsh_agent $AGENT (reaches mn-b)
#   $WORK              a temp dir removed on exit, with the namespaces and anything left in them
# Needs root, iproute2, util-linux (nsenter, unshare).
TOK=$(printf '%05x%03x' $(( $$ & 0xfffff )) $(( RANDOM & 0xfff )))
NS_A=lspbn-$TOK-a NS_B=lspbn-$TOK-b VETH_A=lb${TOK}a VETH_B=lb${TOK}b
NET=${NET:-10.79.0}
WORK=$(mktemp -d /tmp/lspawn-netns-bench-XXXXXX)
AGENT=$WORK/agent

hosts_down() {
  for ns in $NS_A $NS_B; do
    pids=$(ip netns pids $ns 2>/dev/null | tr '\n' ' ')
    [[ -n ${pids// /} ]] && kill -KILL $pids 2>/dev/null
  done
  ip netns del $NS_A 2>/dev/null; ip netns del $NS_B 2>/dev/null; ip link del $VETH_A 2>/dev/null
  rm -rf "$WORK"
}
trap hosts_down EXIT

hosts_up() {
  [[ $(id -u) == 0 ]] || { echo "needs root (network namespaces)" >&2; exit 1; }
  ip netns add $NS_A && ip netns add $NS_B || exit 1
  ip link add $VETH_A type veth peer name $VETH_B || exit 1
  ip link set $VETH_A netns $NS_A && ip link set $VETH_B netns $NS_B
  ip -n $NS_A link set $VETH_A name mnet0 && ip -n $NS_B link set $VETH_B name mnet0
  ip -n $NS_A addr add $NET.1/24 dev mnet0 && ip -n $NS_B addr add $NET.2/24 dev mnet0
  for ns in $NS_A $NS_B; do ip -n $ns link set lo up; ip -n $ns link set mnet0 up; done
  for _ in $(seq 100); do
    ip -n $NS_A link show mnet0 | grep -q LOWER_UP && ip -n $NS_B link show mnet0 | grep -q LOWER_UP && break
    sleep 0.05
  done
  cat >$AGENT <<AGENT
#!/bin/bash
# rsh agent for mpirun: "agent [opts] HOST cmd..." runs cmd on mn-b
while [[ \${1:-} == -* ]]; do case \$1 in -[oplFiJ]) shift 2 ;; *) shift ;; esac; done
shift
exec nsenter --net=/run/netns/$NS_B unshare --uts sh -c 'hostname mn-b && exec bash -c "\$*"' sh "\$@"
AGENT
  chmod +x $AGENT
}

on() {
  local h=$1 ns
  shift
  [[ $h == a ]] && ns=$NS_A || ns=$NS_B
  exec nsenter --net=/run/netns/$ns unshare --uts sh -c 'hostname "$0" && exec "$@"' "mn-$h" "$@"
}
