# hosts_lib.sh — sourced by the multi-node tests: hosts made of network namespaces on one Linux
# bridge, with names unique to the run, and the checks every such test uses (checks.sh).
#
#   source hosts_lib.sh
#   hosts_require                  # exits 77 (skipped) without root, iproute2, nsenter, unshare, timeout
#   hosts_up 10.79.0 a b c         # hosts mn-a 10.79.0.1, mn-b .2, mn-c .3; removed on exit
#   (on b lspawn ... >$WORK/b.out 2>$WORK/b.err) & pb=$!
#   host_cut c; host_heal c        # c's port on the bridge down / up: c cut from every host
#   hosts_blackhole b c            # b and c drop what they send each other; both still reach a
#   check "what" test $r = 0; check "nothing left" nothing_left
#
# Each host is a namespace lspmn-<token>-<name> holding one end of a veth pair (lv<token><name>,
# the host's address on it); the other end (lp<token><name>) is a port of the bridge lb<token>,
# in a namespace of its own (lspmn-<token>-br), so nothing of the test is in the caller's network
# namespace. The token is unique to the run (pid and a random number): parallel runs do not clash.
# A cut takes the host's bridge port down: whatever the host sends or is sent is dropped without a
# word, while its own link, address and routes stay up, as when a switch port or cable fails (a
# peer's TCP retransmits until the link is back or its timeout). hosts_cleanup, run on exit, kills
# whatever is left in the namespaces and removes them (and with them the veths and the bridge),
# and WORK when set.

# hosts_require: skip (exit 77) where namespaces cannot be made.
hosts_require() {
  [[ $(id -u) == 0 ]] || { echo "SKIP: needs root (network namespaces)"; exit 77; }
  local t
  for t in ip nsenter unshare timeout; do
    command -v $t >/dev/null || { echo "SKIP: $t not installed"; exit 77; }
  done
}

HOSTS=()                      # the hosts' names, in the order given to hosts_up
declare -A HOST_NS HOST_ADDR  # name -> its namespace / its IPv4 address
HOSTS_TOK=$(printf '%05x%03x' $(( $$ & 0xfffff )) $(( RANDOM & 0xfff )))
HOSTS_BR_NS=lspmn-$HOSTS_TOK-br

hosts_cleanup() {
  local ns pids
  for ns in "${HOST_NS[@]}"; do
    pids=$(ip netns pids $ns 2>/dev/null | tr '\n' ' ')
    [[ -n ${pids// /} ]] && kill -KILL $pids 2>/dev/null
  done
  for ns in "${HOST_NS[@]}" $HOSTS_BR_NS; do ip netns del $ns 2>/dev/null; done
  [[ -n ${WORK:-} ]] && rm -rf "$WORK"
}

# hosts_up NET NAME...: host NAME i (from 1) at NET.i, all on one bridge; exits 77 when the
# kernel refuses namespaces, veths or bridges. Sets the EXIT trap to hosts_cleanup.
hosts_up() {
  local net=$1 i=0 h ns
  shift
  trap hosts_cleanup EXIT
  ip netns add $HOSTS_BR_NS || { echo "SKIP: cannot create network namespaces"; exit 77; }
  ip -n $HOSTS_BR_NS link add lb$HOSTS_TOK type bridge || { echo "SKIP: no bridge support"; exit 77; }
  ip -n $HOSTS_BR_NS link set lb$HOSTS_TOK up
  for h in "$@"; do
    i=$((i + 1))
    ns=lspmn-$HOSTS_TOK-$h
    HOSTS+=($h)
    HOST_NS[$h]=$ns
    HOST_ADDR[$h]=$net.$i
    ip netns add $ns || { echo "SKIP: cannot create network namespaces"; exit 77; }
    ip link add lv$HOSTS_TOK$h type veth peer name lp$HOSTS_TOK$h || { echo "SKIP: no veth support"; exit 77; }
    ip link set lv$HOSTS_TOK$h netns $ns && ip link set lp$HOSTS_TOK$h netns $HOSTS_BR_NS
    ip -n $ns addr add $net.$i/24 dev lv$HOSTS_TOK$h
    ip -n $ns link set lo up && ip -n $ns link set lv$HOSTS_TOK$h up
    ip -n $HOSTS_BR_NS link set lp$HOSTS_TOK$h master lb$HOSTS_TOK
    ip -n $HOSTS_BR_NS link set lp$HOSTS_TOK$h up
  done
  for h in "$@"; do host_link_ready $h || { echo "FAIL: host $h's link never came up"; exit 1; }; done
}

# host_link_ready NAME: waits (up to 5 s) until both ends of the host's veth are up.
host_link_ready() {
  for _ in $(seq 100); do
    ip -n ${HOST_NS[$1]} link show lv$HOSTS_TOK$1 | grep -q LOWER_UP &&
      ip -n $HOSTS_BR_NS link show lp$HOSTS_TOK$1 | grep -q LOWER_UP && return 0
    sleep 0.05
  done
  return 1
}
host_cut() { ip -n $HOSTS_BR_NS link set lp$HOSTS_TOK$1 down; }
host_heal() { ip -n $HOSTS_BR_NS link set lp$HOSTS_TOK$1 up && host_link_ready $1; }

# hosts_blackhole X Y / hosts_unblackhole X Y: X and Y drop every packet they send each other
# (a blackhole route each way); both still reach every other host.
hosts_blackhole() {
  ip -n ${HOST_NS[$1]} route add blackhole ${HOST_ADDR[$2]}/32 &&
    ip -n ${HOST_NS[$2]} route add blackhole ${HOST_ADDR[$1]}/32
}
hosts_unblackhole() {
  ip -n ${HOST_NS[$1]} route del blackhole ${HOST_ADDR[$2]}/32
  ip -n ${HOST_NS[$2]} route del blackhole ${HOST_ADDR[$1]}/32
}

# on HOST CMD...: CMD on HOST (its namespace, host name mn-HOST); execs, so $! of `(on ...) &`
# is CMD's pid.
on() {
  local h=$1
  shift
  exec nsenter --net=/run/netns/${HOST_NS[$h]} unshare --uts sh -c 'hostname "$0" && exec "$@"' "mn-$h" "$@"
}

# The pids of the processes named COMM (as /proc/PID/comm says) in HOST's namespace.
host_pids() {
  local p
  for p in $(ip netns pids ${HOST_NS[$1]}); do
    [[ $(cat /proc/$p/comm 2>/dev/null) == "$2" ]] && echo $p
  done
}

source "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
# Nothing may be left running in any host (waits up to 5 s for it).
nothing_left() {
  local h ns=()
  for h in "${HOSTS[@]}"; do ns+=("${HOST_NS[$h]}"); done
  nothing_left_in 5 "${ns[@]}"
}
