#!/usr/bin/env bash
# Runs the project's sbatch scripts (scripts/jobs/) on a private two-node Slurm 22.05 cluster
# (slurm-cluster.sh) and checks what the jobs did:
#   1. slurm-lspawn.sbatch (one lspawn per node, 2 workers each) → COMPLETED, ranks 0..3 all-reduce,
#      each lspawn says what it detected (node N of 2, master sl01:<15000 + job id % 10000>)
#   2. the same with rank 3 (on the second node) exiting 7 → FAILED with ExitCode 7
#   3. slurm-tasks.sbatch (srun starts 4 tasks, no lspawn) → COMPLETED, ranks 0..3 all-reduce
#   4. slurm-mpirun.sbatch (mpirun inside the allocation, ranks carry OMPI_* and orted's SLURM_*)
#      → COMPLETED, ranks 0..3 from OMPI_COMM_WORLD_* (skipped without mpirun)
#   5. scancel -s USR1 / -s USR2 (pre-emption notices) on a slurm-lspawn.sbatch job → every worker
#      gets the signal (through lspawn) and the job COMPLETES
# usage: slurm_jobs_test.sh SOURCE_DIR LSPAWN HELLO_ALLREDUCE TEST_WORKER
# Exit 0 all passed, 1 a check failed, 77 skipped (not root, or no slurm-wlm / unshare).
# Runs itself again inside new PID + mount namespaces: /etc/hosts there names the nodes sl01/sl02,
# and every daemon dies with the namespace whatever happens to this script.
set -uo pipefail
SRC=${1:?usage: slurm_jobs_test.sh SOURCE_DIR LSPAWN HELLO_ALLREDUCE TEST_WORKER}
LSPAWN=$(realpath "${2:?}") HELLO=$(realpath "${3:?}") WORKER=$(realpath "${4:?}") SRC=$(realpath "$SRC")
export LSPAWN HELLO WORKER
if [[ ${LSPAWN_SLURM_TEST_INNER:-} != 1 ]]; then
  [[ $(id -u) == 0 ]] || { echo "SKIP: needs root (slurmd)"; exit 77; }
  for p in slurmctld slurmd sbatch munged unshare; do
    command -v $p >/dev/null || { echo "SKIP: $p not installed (scripts/install-deps.sh)"; exit 77; }
  done
  export LSPAWN_SLURM_TEST_INNER=1
  exec unshare --pid --fork --mount --propagation private --mount-proc "$0" "$@"
fi

D=$(mktemp -d /tmp/lspawn-slurm-test.XXXXXX)
CLUSTER=$SRC/tests/cluster/slurm-cluster.sh
cleanup() { "$CLUSTER" down "$D" >/dev/null 2>&1; rm -rf "$D"; }
trap cleanup EXIT
T0=$SECONDS
"$CLUSTER" up "$D" || { echo "FAIL: cluster did not come up"; exit 1; }
mount --bind "$D/hosts" /etc/hosts || { echo "FAIL: cannot bind-mount $D/hosts"; exit 1; }
export SLURM_CONF=$D/etc/slurm.conf
echo "cluster up in $((SECONDS - T0)) s"
cd "$D"
failed=0
pass() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; failed=1; }

# submit OUT ARGS...: sbatch, prints the job id
submit() {
  local out=$1; shift
  sbatch --parsable -o "$D/$out" "$@" | cut -d';' -f1
}
# wait_job ID [SECONDS]: polls until the job ends; prints "STATE EXITCODE"
wait_job() {
  local id=$1 limit=${2:-25} deadline s
  deadline=$((SECONDS + limit))
  while ((SECONDS < deadline)); do
    s=$(scontrol show job "$id" 2>/dev/null)
    local state; state=$(grep -o 'JobState=[A-Z_]*' <<<"$s" | cut -d= -f2)
    case $state in
      PENDING|RUNNING|CONFIGURING|COMPLETING|"") sleep 0.1 ;;
      *) echo "$state $(grep -o ' ExitCode=[0-9:]*' <<<"$s" | cut -d= -f2)"; return 0 ;;
    esac
  done
  echo "TIMEOUT -"; scancel "$id" 2>/dev/null
}
# wait_count FILE PATTERN N SECONDS JOB: until FILE has N lines matching, or JOB ended
wait_count() {
  local deadline=$((SECONDS + $4)) n
  while ((SECONDS < deadline)); do
    n=$(grep -c -- "$2" "$D/$1" 2>/dev/null)
    ((${n:-0} >= $3)) && return 0
    [[ -n $(squeue -h -j "$5" 2>/dev/null) ]] || return 1
    sleep 0.1
  done
  return 1
}
show() { echo "--- $1"; cat "$D/$1"; echo "---"; }

# 1. one lspawn per node
t=$SECONDS
id=$(submit a.out "$SRC/scripts/jobs/slurm-lspawn.sbatch" "$HELLO")
read -r state code < <(wait_job "$id")
port=$((15000 + id % 10000))
ok=1
[[ $state == COMPLETED && $code == 0:0 ]] || ok=0
for n in 0 1; do
  grep -q "lspawn: Slurm job $id: node $n of 2, master sl01:$port, 2 workers per node" a.out || ok=0
done
for r in 0 1 2 3; do grep -qE "\[([^ ]+ )?rank $r\] rank $r/4: allreduce sum = 10" a.out || ok=0; done
((ok)) && pass "slurm-lspawn.sbatch: job $id COMPLETED, 2 nodes x 2 workers, ranks 0..3 ($((SECONDS - t)) s)" ||
  { fail "slurm-lspawn.sbatch: job $id $state $code"; show a.out; }

# 2. a failing rank on the second node: the job fails with the worker's exit code, via lspawn
t=$SECONDS
id=$(submit b.out "$SRC/scripts/jobs/slurm-lspawn.sbatch" "$HELLO" --fail-rank 3 --exit-code 7)
read -r state code < <(wait_job "$id")
ok=1
[[ $state == FAILED && $code == 7:0 ]] || ok=0
grep -q "lspawn: root cause: process 3 terminated with exit code 7" b.out || ok=0
((ok)) && pass "failing rank 3: job $id FAILED with ExitCode 7:0, lspawn names rank 3 ($((SECONDS - t)) s)" ||
  { fail "failing rank 3: job $id $state $code (want FAILED 7:0)"; show b.out; }

# 3. one task per worker, no lspawn: the runtime reads SLURM_*
t=$SECONDS
id=$(submit c.out "$SRC/scripts/jobs/slurm-tasks.sbatch" "$HELLO")
read -r state code < <(wait_job "$id")
ok=1
[[ $state == COMPLETED && $code == 0:0 ]] || ok=0
for r in 0 1 2 3; do grep -q "^rank $r/4: allreduce sum = 10" c.out || ok=0; done
((ok)) && pass "slurm-tasks.sbatch: job $id COMPLETED, 4 tasks = ranks 0..3 ($((SECONDS - t)) s)" ||
  { fail "slurm-tasks.sbatch: job $id $state $code"; show c.out; }

# 4. mpirun inside the allocation: the runtime prefers OMPI_* over the SLURM_* of orted's step
if command -v mpirun >/dev/null; then
  t=$SECONDS
  id=$(submit m.out "$SRC/scripts/jobs/slurm-mpirun.sbatch" "$HELLO")
  read -r state code < <(wait_job "$id")
  ok=1
  [[ $state == COMPLETED && $code == 0:0 ]] || ok=0
  for r in 0 1 2 3; do grep -q "^rank $r/4: allreduce sum = 10" m.out || ok=0; done
  ((ok)) && pass "slurm-mpirun.sbatch: job $id COMPLETED, mpirun -np 4 over 2 nodes, ranks 0..3 ($((SECONDS - t)) s)" ||
    { fail "slurm-mpirun.sbatch: job $id $state $code"; show m.out; }
else
  echo "skipped: slurm-mpirun.sbatch (no mpirun)"
fi

# 5. pre-emption notices: scancel -s USR1/USR2 reaches lspawn, lspawn forwards it to the workers
for sig in USR1 USR2; do
  t=$SECONDS
  id=$(submit "$sig.out" "$SRC/scripts/jobs/slurm-lspawn.sbatch" "$WORKER" usr-then-exit)
  ok=1
  wait_count "$sig.out" "ready" 4 20 "$id" || ok=0
  scancel --signal="$sig" "$id" || ok=0
  read -r state code < <(wait_job "$id")
  [[ $state == COMPLETED && $code == 0:0 ]] || ok=0
  (($(grep -c "got SIG$sig" "$sig.out") == 4)) || ok=0
  ((ok)) && pass "scancel -s $sig: all 4 workers got SIG$sig through lspawn, job $id COMPLETED ($((SECONDS - t)) s)" ||
    { fail "scancel -s $sig: job $id $state $code"; show "$sig.out"; }
done

echo "total $((SECONDS - T0)) s"
exit $failed
