#!/usr/bin/env bash
# Emulates the two pods of scripts/jobs/pytorchjob.yaml on this machine: two lspawn processes
# started with exactly the command of the manifest's containers, each with the environment the
# training-operator (v1.7+) gives its pod (MASTER_ADDR=<job>-master-0, MASTER_PORT, WORLD_SIZE =
# pods x nprocPerNode, RANK = PET_NODE_RANK = pod index, PET_NNODES, PET_NPROC_PER_NODE), like
# /work/shared/cluster/pytorchjob-emu.sh but on loopback: the master service name resolves to
# 127.0.0.1 through a private /etc/hosts (mount namespace), the port is a free one.
# Checks: both pods exit 0, each lspawn prints what it detected, 4 ranks all-reduce.
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
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pids=()
for ((i = 0; i < pods; i++)); do
  env PYTHONUNBUFFERED=0 MASTER_ADDR="$job-master-0" MASTER_PORT="$port" WORLD_SIZE=$((pods * nproc)) \
    RANK=$i PET_NPROC_PER_NODE="$nproc" PET_NODE_RANK=$i PET_NNODES="$pods" \
    timeout 60 "$LSPAWN" "$HELLO" >"$D/pod$i.out" 2>&1 &
  pids+=($!)
done
ok=1
for i in "${!pids[@]}"; do wait "${pids[$i]}" || { echo "pod $i exited $?"; ok=0; }; done
cat "$D"/pod*.out >"$D/all.out"
for ((i = 0; i < pods; i++)); do
  grep -q "lspawn: Kubernetes PyTorchJob: node $i of $pods, master $job-master-0:$port, $nproc workers per node" "$D/pod$i.out" || ok=0
done
for ((r = 0; r < pods * nproc; r++)); do
  grep -qE "\[([^ ]+ )?rank $r\] rank $r/$((pods * nproc)): allreduce sum" "$D/all.out" || ok=0
done
if ((ok)); then echo "ok: PyTorchJob $job: $pods pods x $nproc workers, ranks 0..$((pods * nproc - 1))"; exit 0; fi
echo "FAIL: PyTorchJob emulation"; for f in "$D"/pod*.out; do echo "--- $f"; cat "$f"; done; exit 1
