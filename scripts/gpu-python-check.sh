#!/usr/bin/env bash
# The Python side's CUDA checks, in one call of the GPU machine (docs/gpu.md, "The Python side on a GPU"):
# builds lspawn there against its CUDA torch (.gpu/build-cuda.sh, ~2 min on 16 cores), then runs
#   - backend cudart (backend_cudart_test): the backend's CUDA runtime lookup, its calls succeeding on a device;
#   - python_backend.cuda: CUDA tensors through the torch.distributed backend `lspawn` (CUDA IPC and staged,
#     against the results computed, DDP against NCCL, a mismatched rank), after the shim's build;
#   - python_backend.ops, errors: the backend's CPU tests with that machine's torch;
#   - python_mp.cuda: CUDA tensors in `lspawn.spawn`'s args, against torch.multiprocessing;
#   - bench/python_backend/cuda_bench.py: lspawn (CUDA IPC, staged) against NCCL, one table.
# Each of them skips (77) or is absent on a machine without a GPU; here none may skip.
# Prepare on this machine (network): cp -r ../shared/gpu .gpu && echo /.gpu/ >> .git/info/exclude &&
#   bash .gpu/fetch-debs.sh; then with the device tool: command `bash scripts/gpu-python-check.sh`,
#   carry [".gpu"], timeout_s 540. Logs and the bench's JSON land in $OUT (LOG_DIR).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-${LOG_DIR:-/tmp}}
[ -f "$root/.gpu/build-cuda.sh" ] || { echo "gpu-python-check: no .gpu/build-cuda.sh (see the header)" >&2; exit 2; }
tests='backend cudart|python_backend\.(build_shim|cuda|ops|errors)$|python_mp\.cuda$'
# --no-tests=error: a filter that matches nothing fails; a skipped test (77) is reported as "Not Run" and fails
# the grep below: on this machine every one must run.
LOG_DIR=$out bash "$root/.gpu/build-cuda.sh" \
  "ctest -R '$tests' --no-tests=error --output-on-failure --timeout 400 -j2 2>&1 | tee $out/ctest.log; \
   ! grep -q 'Not Run\\|Skipped' $out/ctest.log && grep -q '100% tests passed' $out/ctest.log" \
  "cd '$root' && PYTHONPATH='$root/python' LSPAWN_ENGINE=${BUILD:-/tmp/build-cuda}/shm/liblspawn_engine.so \
   LSPAWN_BACKEND_SHIM_DIR=${BUILD:-/tmp/build-cuda}/tests/python_backend/shims \
   timeout 240 python3 bench/python_backend/cuda_bench.py --json $out/cuda_bench.json 2>&1 | tee $out/cuda_bench.md"
