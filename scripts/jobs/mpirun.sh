#!/bin/bash
# Open MPI's mpirun starts every rank; lspawn's runtime reads OMPI_COMM_WORLD_{RANK,SIZE,
# LOCAL_RANK,LOCAL_SIZE} (docs/multi-node.md, "Open MPI"). MASTER_PORT defaults to
# 15000 + OMPI_MCA_ess_base_jobid % 10000; across nodes pass the host of rank 0:
#   mpirun -np 8 --hostfile hosts -x MASTER_ADDR=node0 ./train
#
#   scripts/jobs/mpirun.sh NP PROGRAM [ARGS...]     (on this node)
# --allow-run-as-root / --oversubscribe: needed in root containers and with more ranks than cores.
np=${1:?usage: mpirun.sh NP PROGRAM [ARGS...]}
shift
exec mpirun -np "$np" --allow-run-as-root --oversubscribe --bind-to none "$@"
