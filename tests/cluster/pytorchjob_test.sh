#!/usr/bin/env bash
# Emulates the pods of scripts/jobs/pytorchjob.yaml and scripts/jobs/pytorchjob-elastic.yaml on
# this machine: lspawn processes started with exactly the command of the manifests' containers,
# each with the environment the training-operator gives its pod, like
# /work/shared/cluster/pytorchjob-emu.sh but on loopback: the service names resolve to 127.0.0.1
# through a private /etc/hosts (mount namespace), the ports are free ones.
# - pytorchjob.yaml (v1.7+): MASTER_ADDR=<job>-master-0, MASTER_PORT, WORLD_SIZE = pods x
#   nprocPerNode, RANK = PET_NODE_RANK = pod index, PET_NNODES, PET_NPROC_PER_NODE. Checks: both
#   pods exit 0, each lspawn prints what it detected, 4 ranks all-reduce.
# - pytorchjob-elastic.yaml (elasticPolicy): PET_RDZV_ENDPOINT=<job>-worker-0:PORT,
#   PET_RDZV_BACKEND, PET_NNODES=MIN:MAX, PET_MAX_RESTARTS, PET_NPROC_PER_NODE, PET_RDZV_CONF and no
#   node rank. Checks, with minReplicas pods (the job forms after the last call) and with
#   maxReplicas pods (at once): every pod exits 0 and prints what it detected, and every rank of
#   pods x nProcPerNode all-reduces.
# - trainjob.yaml (Kubeflow Trainer v2): PET_NNODES, PET_NPROC_PER_NODE=auto, PET_NODE_RANK = pod
#   index, PET_MASTER_ADDR=<job>-node-0-0.<job>, PET_MASTER_PORT. Checks: both pods exit 0, count
#   `auto` alike and print it, and every rank of pods x that count all-reduces.
# usage: pytorchjob_test.sh SOURCE_DIR LSPAWN HELLO_ALLREDUCE   (exit 77: not root / no unshare)
set -uo pipefail
SRC=${1:?} LSPAWN=${2:?} HELLO=${3:?}
YAML=$SRC/scripts/jobs/pytorchjob.yaml
if [[ ${LSPAWN_K8S_TEST_INNER:-} != 1 ]]; then
  [[ $(id -u) == 0 ]] && command -v unshare >/dev/null || { echo "SKIP: needs root and unshare"; exit 77; }
  export LSPAWN_K8S_TEST_INNER=1
  exec unshare --mount --propagation private "$0" "$@"
fi
job=$(sed -n 's/^  name: *//p' "$YAML" | head -1)
nproc=$(sed -n 's/^ *nprocPerNode: *"\{0,1\}\([0-9]*\)"\{0,1\}/\1/p' "$YAML")
pods=$(grep -c 'replicas: 1' "$YAML")
# the container command, e.g. ["lspawn", "/opt/train/hello_allreduce"]: lspawn with no flags
cmd=$(sed -n 's/^ *command: *\[\(.*\)\]/\1/p' "$YAML" | head -1)
[[ $cmd == '"lspawn", "/opt/train/hello_allreduce"' ]] || { echo "FAIL: unexpected command in the manifest: $cmd"; exit 1; }
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
{ cat /etc/hosts; echo "127.0.0.1 $job-master-0"; } >"$D/hosts"
mount --bind "$D/hosts" /etc/hosts || { echo "FAIL: cannot bind-mount /etc/hosts"; exit 1; }
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"  # free_port
ok=1
# run_pods WHAT N POD: runs `POD I` for pods I = 0..N-1 at once (each an lspawn; output in
# $D/podI.out, all of it in $D/all.out) and waits; a pod that exits non-zero is named.
run_pods() {
  local what=$1 n=$2 pod=$3 i pids=()
  rm -f "$D"/pod*.out
  for ((i = 0; i < n; i++)); do
    "$pod" $i >"$D/pod$i.out" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || { echo "$what pod $i exited $?"; ok=0; }; done
  cat "$D"/pod*.out >"$D/all.out"
}
# all_ranks WHAT WORLD: every rank of a world of WORLD printed its all_reduce.
all_ranks() {
  local r
  for ((r = 0; r < $2; r++)); do
    grep -qE "\[([^ ]+ )?rank $r\] rank $r/$2: allreduce sum" "$D/all.out" || { echo "$1: rank $r/$2 missing"; ok=0; }
  done
}
# verdict WHAT SUMMARY: every pod's output and exit 1 when a check failed, else "ok: SUMMARY".
verdict() {
  if ((!ok)); then
    echo "FAIL: $1"; for f in "$D"/pod*.out; do echo "--- $f"; cat "$f"; done; exit 1
  fi
  echo "ok: $2"
}

port=$(free_port)
static_pod() {
  env PYTHONUNBUFFERED=0 MASTER_ADDR="$job-master-0" MASTER_PORT="$port" WORLD_SIZE=$((pods * nproc)) \
    RANK=$1 PET_NPROC_PER_NODE="$nproc" PET_NODE_RANK=$1 PET_NNODES="$pods" \
    timeout 60 "$LSPAWN" "$HELLO"
}
run_pods PyTorchJob "$pods" static_pod
for ((i = 0; i < pods; i++)); do
  grep -q "lspawn: Kubernetes PyTorchJob: node $i of $pods, master $job-master-0:$port, $nproc workers per node" "$D/pod$i.out" || ok=0
done
all_ranks PyTorchJob $((pods * nproc))
verdict "PyTorchJob emulation" "PyTorchJob $job: $pods pods x $nproc workers, ranks 0..$((pods * nproc - 1))"

# The TrainJob (Kubeflow Trainer v2): node rank from the pod index, nproc "auto".
TYAML=$SRC/scripts/jobs/trainjob.yaml
tjob=$(sed -n 's/^  name: *//p' "$TYAML" | head -1)
tnodes=$(sed -n 's/^ *numNodes: *\([0-9]*\)$/\1/p' "$TYAML" | head -1)
tcmd=$(sed -n 's/^ *command: *\[\(.*\)\]/\1/p' "$TYAML" | head -1)
[[ $tcmd == '"lspawn", "/opt/train/hello_allreduce"' && -n $tnodes ]] ||
  { echo "FAIL: unexpected TrainJob manifest: command $tcmd, $tnodes nodes"; exit 1; }
tmaster="$tjob-node-0-0.$tjob"
echo "127.0.0.1 $tmaster" >>"$D/hosts"
port=$(free_port)
trainjob_pod() {
  env PET_NNODES="$tnodes" PET_NPROC_PER_NODE=auto PET_NODE_RANK=$1 PET_MASTER_ADDR="$tmaster" PET_MASTER_PORT="$port" \
    timeout 60 "$LSPAWN" "$HELLO"
}
run_pods TrainJob "$tnodes" trainjob_pod
per=$(sed -n 's/^lspawn: PET_NPROC_PER_NODE=auto: \([0-9]*\) workers\{0,1\} per node.*/\1/p' "$D/pod0.out" | head -1)
[[ -n $per ]] || { echo "TrainJob: pod 0 did not say how many workers auto is"; ok=0; per=0; }
for ((i = 0; i < tnodes; i++)); do
  grep -q "lspawn: Kubernetes PyTorchJob: node $i of $tnodes, master $tmaster:$port, workers per node: auto (PET_NPROC_PER_NODE)" "$D/pod$i.out" || { echo "TrainJob: pod $i's detection line"; ok=0; }
  grep -q "lspawn: PET_NPROC_PER_NODE=auto: $per worker" "$D/pod$i.out" || { echo "TrainJob: pod $i counted auto otherwise"; ok=0; }
done
all_ranks TrainJob $((tnodes * per))
verdict "TrainJob emulation" "TrainJob $tjob: $tnodes pods x auto = $per workers, ranks 0..$((tnodes * per - 1))"

# The elastic job.
EYAML=$SRC/scripts/jobs/pytorchjob-elastic.yaml
ejob=$(sed -n 's/^  name: *//p' "$EYAML" | head -1)
field() { sed -n "s/^ *$1: *\"\{0,1\}\([0-9]*\)\"\{0,1\}\$/\1/p" "$EYAML" | head -1; }
emin=$(field minReplicas) emax=$(field maxReplicas) erestarts=$(field maxRestarts) enproc=$(field nProcPerNode)
conf="$(sed -n 's/^ *- key: *//p' "$EYAML" | head -1)=$(sed -n 's/^ *value: *"\(.*\)"/\1/p' "$EYAML" | head -1)"
ecmd=$(sed -n 's/^ *command: *\[\(.*\)\]/\1/p' "$EYAML" | head -1)
[[ $ecmd == '"lspawn", "/opt/train/hello_allreduce"' && -n $emin && -n $emax && -n $enproc && $conf == last_call_timeout=* ]] ||
  { echo "FAIL: unexpected elastic manifest: command $ecmd, $emin:$emax nodes, $enproc per node, conf $conf"; exit 1; }
echo "127.0.0.1 $ejob-worker-0" >>"$D/hosts"   # the bind mount shows the file: the name resolves now
elastic_pod() {
  env PYTHONUNBUFFERED=0 PET_RDZV_ENDPOINT="$ejob-worker-0:$port" PET_RDZV_BACKEND=c10d PET_NNODES="$emin:$emax" \
    PET_MAX_RESTARTS="$erestarts" PET_NPROC_PER_NODE="$enproc" PET_RDZV_CONF="$conf" \
    timeout 60 "$LSPAWN" "$HELLO"
}
for pods in "$emin" "$emax"; do
  port=$(free_port)
  run_pods elastic "$pods" elastic_pod
  n=$(grep -c "lspawn: Kubernetes PyTorchJob: elastic, $emin to $emax nodes, node rank from the rendezvous at $ejob-worker-0:$port, $enproc workers per node" "$D/all.out")
  ((n == pods)) || { echo "elastic: $n of $pods pods printed what they detected"; ok=0; }
  grep -q "from the environment (torchrun's PET_\* defaults): .*PET_MAX_RESTARTS=$erestarts" "$D/all.out" || ok=0
  all_ranks elastic $((pods * enproc))
  verdict "elastic PyTorchJob emulation with $pods pods" \
    "elastic PyTorchJob $ejob ($emin:$emax): $pods pods x $enproc workers, ranks 0..$((pods * enproc - 1))"
done
exit 0
