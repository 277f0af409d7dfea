# checks.sh — sourced by the multi-node test scripts (netns, ssh, partition, slow link): the tally
# of checks, waits on a log file, times, and "nothing is left" in the test's network namespaces.
# Each script keeps a one-line `nothing_left` naming its own namespaces.
#   check WHAT CMD...           runs CMD: "ok: WHAT" (PASSES+1) or "FAIL: WHAT" (FAILS+1)
#   until_in FILE TEXT SECS [N] waits until TEXT is in FILE at least N times (default 1)
#   nothing_left_in SECS NS...  waits until no process runs in any NS but those in KEEP_PIDS;
#                               else prints what is left and fails
#   secs_since T [DECIMALS]     seconds from T (a `now`) to now (2 decimals); stamp: since T0

FAILS=0
PASSES=0
KEEP_PIDS=()  # processes of the test's own that may run on (the ssh test's sshd listeners)
pass() { echo "ok: $*"; PASSES=$((PASSES + 1)); }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
has() { grep -qF -- "$2" "$1"; }
count_in() { grep -cF -- "$2" "$1" 2>/dev/null; }
until_in() {
  for _ in $(seq $(($3 * 20))); do
    (($(count_in "$1" "$2") >= ${4:-1})) && return 0
    sleep 0.05
  done
  return 1
}
elapsed_below() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
between() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v >= lo && v <= hi) }'; }
now() { date +%s.%N; }
secs_since() { awk -v a="$1" -v b="$(now)" -v d="${2:-2}" 'BEGIN { printf "%.*f", d, b - a }'; }
T0=$(now)
stamp() { printf '%s s' "$(secs_since "$T0" 1)"; }

# The pids in namespaces NS... but KEEP_PIDS, on one line.
ns_pids() {
  local ns
  for ns in "$@"; do ip netns pids "$ns"; done 2>/dev/null |
    grep -vxF -f <(printf '%s\n' "${KEEP_PIDS[@]}") | tr '\n' ' '
}
nothing_left_in() {
  local secs=$1 left
  shift
  for _ in $(seq $((secs * 10))); do
    left=$(ns_pids "$@")
    [[ -z ${left// /} ]] && return 0
    sleep 0.1
  done
  echo "   left running: $left: $(ps -o pid,args -p ${left// /,} 2>/dev/null | tail -n +2 | tr '\n' ';')"
  return 1
}
