#!/usr/bin/env bash
# Runs scripts/jobs/mpirun.sh with 4 local ranks of hello_allreduce: no lspawn, the runtime reads
# OMPI_COMM_WORLD_* (and derives MASTER_PORT from the Open MPI job id). Checks every rank's
# all_reduce. usage: mpirun_test.sh SOURCE_DIR HELLO_ALLREDUCE   (exit 77: no mpirun)
set -uo pipefail
SRC=${1:?} HELLO=${2:?}
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed (openmpi-bin)"; exit 77; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
t0=$(date +%s.%N)
timeout 60 "$SRC/scripts/jobs/mpirun.sh" 4 "$HELLO" >"$out" 2>&1
rc=$?
echo "mpirun exit $rc in $(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || echo '?') s"
ok=1
((rc == 0)) || ok=0
for r in 0 1 2 3; do grep -q "^rank $r/4: allreduce sum = 10" "$out" || ok=0; done
if ((ok)); then echo "ok: mpirun -np 4: ranks 0..3 from OMPI_COMM_WORLD_*, all_reduce correct"; exit 0; fi
echo "FAIL: mpirun -np 4 (exit $rc)"; cat "$out"; exit 1
