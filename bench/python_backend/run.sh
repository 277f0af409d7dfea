#!/usr/bin/env bash
# Benchmarks the torch.distributed backend `lspawn` against gloo (and Open MPI / the engine from C):
# builds engine_bench.c (and mpi_allreduce.c when mpicc exists) into a temp dir, runs them, then
# allreduce_bench.py and ddp_bench.py with the chosen Python, and prints the tables.
#
#   bench/python_backend/run.sh [--python PATH] [--ops all_reduce,all_gather,broadcast] [--nprocs 2,4]
#                               [--budget-ms 300] [--no-ddp] [--no-mpi] [--json-dir DIR]
#     --python  the Python with torch (default: /work/main/.deps/torch2/bin/python, i.e. $root/.deps/torch2)
#     --json-dir  keep every row as JSON there (allreduce.json, ddp.json)
#   env (read here, passed to the ranks):
#     LSPAWN_ENGINE            liblspawn_engine.so (default: $root/build/shm/liblspawn_engine.so)
#     LSPAWN_BACKEND_SHIM_DIR  the backend's shims for that torch (default: $root/build/python_backend_shims)
#     PYTHONPATH               $root/python is put first
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PY=$root/.deps/torch2/bin/python
OPS=all_reduce,all_gather,broadcast
NPROCS=2,4
BUDGET_MS=300
DDP=1
MPI=1
JSON_DIR=
while [[ $# -gt 0 ]]; do
  case $1 in
    --python) PY=$2; shift 2 ;;
    --ops) OPS=$2; shift 2 ;;
    --nprocs) NPROCS=$2; shift 2 ;;
    --budget-ms) BUDGET_MS=$2; shift 2 ;;
    --no-ddp) DDP=0; shift ;;
    --no-mpi) MPI=0; shift ;;
    --json-dir) JSON_DIR=$2; shift 2 ;;
    -h|--help) sed -n 2,14p "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
export LSPAWN_ENGINE=${LSPAWN_ENGINE:-$root/build/shm/liblspawn_engine.so}
export LSPAWN_BACKEND_SHIM_DIR=${LSPAWN_BACKEND_SHIM_DIR:-$root/build/python_backend_shims}
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
[[ -f $LSPAWN_ENGINE ]] || { echo "run.sh: no engine at $LSPAWN_ENGINE (set LSPAWN_ENGINE)" >&2; exit 2; }
[[ -x $PY ]] || { echo "run.sh: no Python at $PY (use --python)" >&2; exit 2; }
tmp=$(mktemp -d /tmp/lspawn-pybench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
[[ -n $JSON_DIR ]] && mkdir -p "$JSON_DIR"

echo "# $(date -u +%FT%TZ) on $(hostname): $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - <<'EOF'
import re, subprocess, sys, os, torch
cfg = torch.__config__.show()
blas = re.search(r"BLAS_INFO=([^,\s]+)", cfg)
libs = []
try:
    so = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    out = subprocess.run(["ldd", so], capture_output=True, text=True).stdout
    libs = sorted({l.split()[0] for l in out.splitlines() if re.search(r"blas|mkl|lapack", l, re.I)})
except Exception:
    pass
mkl = "MKL" if "Math Kernel Library" in cfg else ""
print("# Python %s (%s), torch %s, BLAS_INFO=%s%s%s" % (sys.version.split()[0], sys.executable, torch.__version__,
      blas.group(1) if blas else "?", " (%s)" % mkl if mkl else "", (", linked: " + " ".join(libs)) if libs else ""))
EOF
echo "# LSPAWN_ENGINE=$LSPAWN_ENGINE LSPAWN_BACKEND_SHIM_DIR=$LSPAWN_BACKEND_SHIM_DIR"

# The engine from C (all_reduce <= 16 KiB), for the "Python overhead" figure.
engine_json=$tmp/engine.jsonl
if [[ ,$OPS, == *,all_reduce,* ]]; then
  cc -O2 -Wall -I "$root/shm" "$here/engine_bench.c" "$LSPAWN_ENGINE" -Wl,-rpath,"$(dirname "$LSPAWN_ENGINE")" \
    -o "$tmp/engine_bench"
  for n in ${NPROCS//,/ }; do "$tmp/engine_bench" "$n" "$BUDGET_MS" 4 1024 16384 >> "$engine_json"; done
fi

# Open MPI all_reduce at the same sizes and with the same timing rules.
mpi_json=$tmp/mpi.jsonl
if [[ $MPI == 1 && ,$OPS, == *,all_reduce,* ]]; then
  if command -v mpicc > /dev/null && command -v mpirun > /dev/null; then
    mpicc -O2 "$here/mpi_allreduce.c" -o "$tmp/mpi_allreduce"
    echo "# $(mpirun --version 2>&1 | head -1)"
    for n in ${NPROCS//,/ }; do
      mpirun --allow-run-as-root --oversubscribe -np "$n" "$tmp/mpi_allreduce" "$BUDGET_MS" >> "$mpi_json"
    done
  else
    echo "# Open MPI: mpicc/mpirun missing, column left empty"
  fi
fi

rc=0
t0=$SECONDS
"$PY" "$here/allreduce_bench.py" --nprocs "$NPROCS" --ops "$OPS" --budget-ms "$BUDGET_MS" \
  --mpi-json "$mpi_json" --engine-json "$engine_json" ${JSON_DIR:+--json "$JSON_DIR/allreduce.json"} || rc=1
echo "# collectives: $((SECONDS - t0)) s"
if [[ $DDP == 1 ]]; then
  t0=$SECONDS
  "$PY" "$here/ddp_bench.py" --nprocs "$NPROCS" ${JSON_DIR:+--json "$JSON_DIR/ddp.json"} || rc=1
  echo "# DDP: $((SECONDS - t0)) s"
fi
echo "# done $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
