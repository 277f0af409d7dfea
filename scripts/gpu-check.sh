#!/usr/bin/env bash
# What issue #20 left to a machine with an NVIDIA GPU, in one run (docs/gpu.md, "What ran on a
# GPU"): the CUDA path of the shm backend against gloo (and NCCL where it can run), DDP's NCCL
# default in the three precisions, several ranks on one GPU through shm, DDPSpawn on CUDA, an
# unmodified torch NCCL script under lspawn, --nproc-per-node gpu, --preload's CUDA refusal and --virtual-local-rank.
# Each check prints its command, its output's tail and PASS/FAIL; a summary ends the run.
#
#   bash scripts/gpu-check.sh [--build DIR] [--out DIR] [--python PY] [--device cuda|cpu] [--csv F]
#
# --build: a build of lspawn with CUDA (and NCCL): .gpu/build-cuda.sh makes one in /tmp/build-cuda.
#   On the device machine it runs in the same call as the build, through scripts/gpu-session.sh
#   (which runs the suite after it and packs the logs into the 8 files the device tool brings back).
# --csv: scikit-learn's digits.csv.gz for the DDP checks. Default: Debian's python3-sklearn copy,
#   else .gpu/digits.csv.gz (the GPU machine has no sklearn: copy it there with fetch-debs.sh),
#   else the one of --python's sklearn.
# --out: where the logs and the benchmark's JSON go (default: a temp dir, printed; removed at the
#   end when every check passed).
# --device cpu: the same checks with CPU tensors and models, those that need CUDA skipped: how
#   this script is tested on a machine without a GPU (ctest: e2e.gpu_session_script_on_cpu).
# Exit status: the number of failed checks (0: all passed or skipped).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$here/build
out=""
py=$(command -v python3 || true)
device=cuda
csv=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --csv) csv=$2; shift 2 ;;
    *) echo "gpu-check.sh: unknown argument '$1' (--build DIR --out DIR --python PY --device cuda|cpu --csv F)" >&2; exit 2 ;;
  esac
done
case "$device" in cuda|cpu) ;; *) echo "gpu-check.sh: --device: '$device' is not cuda or cpu" >&2; exit 2 ;; esac
own_out=0
[ -n "$out" ] || { out=$(mktemp -d "${TMPDIR:-/tmp}/lspawn-gpu-check.XXXXXX"); own_out=1; }
mkdir -p "$out"
lspawn=$build/launcher/lspawn
bench=$build/bench/collectives/lspawn_bench_collectives
digits=$build/examples/digits_ddp
for f in "$lspawn" "$bench" "$digits"; do
  [ -x "$f" ] || { echo "gpu-check.sh: $f is missing: build lspawn first (--build DIR)" >&2; exit 2; }
done

if [ -z "$csv" ]; then
  for c in /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz "$here/.gpu/digits.csv.gz" \
           "$([ -n "$py" ] && "$py" -c 'import os, sklearn; print(os.path.dirname(sklearn.__file__))' 2>/dev/null)/datasets/data/digits.csv.gz"; do
    [ -f "$c" ] && { csv=$c; break; }
  done
fi
[ -f "$csv" ] || { echo "gpu-check.sh: no digits.csv.gz found (--csv F; see the header)" >&2; exit 2; }

passed=0 failed=0 skipped=0 summary=""
note() { summary+="$1"$'\n'; echo "== $1"; }
logname() { echo "$out/$(echo "$1" | tr -c 'A-Za-z0-9_.-' '_' | cut -c1-100).log"; }
# all_match LOG PATTERNS: every extended regex of PATTERNS (separated by " && ") has a line in LOG.
all_match() {
  local log=$1 rest=$2 p
  while [ -n "$rest" ]; do
    p=${rest%% && *}; [ "$p" = "$rest" ] && rest="" || rest=${rest#* && }
    grep -Eq -- "$p" "$log" || return 1
  done
}
# check NAME PATTERNS CMD...: runs CMD (at most 300 s), passes when it exits 0 and its output
# matches PATTERNS (all_match).
check() {
  local name=$1 pattern=$2; shift 2
  local log; log=$(logname "$name")
  echo; echo "== $name"; echo "+ $*"
  local t0; t0=$(date +%s%N)
  timeout -k 10 300 "$@" > "$log" 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  tail -n 12 "$log"
  if [ $rc = 0 ] && all_match "$log" "$pattern"; then
    passed=$((passed + 1)); note "PASS ($ms ms) $name"
  else
    failed=$((failed + 1)); note "FAIL (exit $rc, $ms ms; wanted /$pattern/) $name: $log"
  fi
}
# fails NAME PATTERN CMD...: passes when CMD exits non-zero and its output matches PATTERN.
fails() {
  local name=$1 pattern=$2; shift 2
  local log; log=$(logname "$name")
  echo; echo "== $name"; echo "+ $*"
  timeout -k 10 120 "$@" > "$log" 2>&1; local rc=$?
  tail -n 12 "$log"
  if [ $rc != 0 ] && [ $rc != 124 ] && all_match "$log" "$pattern"; then
    passed=$((passed + 1)); note "PASS (refused, exit $rc) $name"
  else
    failed=$((failed + 1)); note "FAIL (exit $rc; wanted a refusal matching /$pattern/) $name: $log"
  fi
}
skip() { skipped=$((skipped + 1)); note "SKIP $1: $2"; }

echo "# gpu-check: build $build, device $device, logs in $out, $(date -u +%FT%TZ)"
gpus=0
if [ "$device" = cuda ]; then
  nvidia-smi -L 2>&1 | tee "$out/nvidia-smi.txt"
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  [ "$gpus" -gt 0 ] || { echo "gpu-check.sh: --device cuda, but nvidia-smi lists no GPU" >&2; exit 2; }
fi
[ -n "$py" ] && "$py" -c 'import torch; print("python torch", torch.__version__, "cuda", torch.version.cuda,
  "available", torch.cuda.is_available(), "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")' 2>&1 \
  | tee "$out/torch.txt"
# NCCL among ranks needs a GPU per rank ("Duplicate GPU detected" otherwise).
nccl_ranks=$gpus; [ "$nccl_ranks" -gt 4 ] && nccl_ranks=4

# 1. The collectives on CUDA tensors: shm (device to device through CUDA IPC, collectives/cuda_ipc.hpp)
#    against gloo (its own host copy, over loopback TCP) at N = 2 on one GPU, and shm staged through
#    pinned host memory (LSPAWN_SHM_CUDA_IPC=0; its JSON only in the logs' archive); the issue's
#    goal is 5x gloo's bus bandwidth at 64 MiB. NCCL where one GPU per rank exists (world size 1
#    otherwise).
check "bench: all_reduce/broadcast/all_gather, $device tensors, shm vs gloo, N=2" "all_reduce +shm +67108864" \
  "$lspawn" --nprocs 2 "$bench" --device "$device" --backends shm,gloo --min-bytes 1M --max-bytes 64M --step 8 \
  --json "$out/bench-$device-n2.json" --label "$device-n2"
if [ "$device" = cuda ]; then
  check "bench: cuda tensors, shm staged through host memory (LSPAWN_SHM_CUDA_IPC=0), N=2" "all_reduce +shm +67108864" \
    env LSPAWN_SHM_CUDA_IPC=0 "$lspawn" --nprocs 2 "$bench" --device cuda --backends shm --min-bytes 1M --max-bytes 64M \
    --step 8 --json "$out/staged-cuda-n2.json" --label "cuda-n2-staged"
fi
if [ -s "$out/bench-$device-n2.json" ]; then
  "$py" - "$out/bench-$device-n2.json" "$out/staged-$device-n2.json" <<'EOF' | tee "$out/bench-ratio.txt"
import json, os, sys
rows = json.load(open(sys.argv[1]))
staged = json.load(open(sys.argv[2])) if os.path.exists(sys.argv[2]) else []
by = {(r["op"], r["backend"], r["bytes"]): r["busbw_gbs"] for r in rows}
st = {(r["op"], r["bytes"]): r["busbw_gbs"] for r in staged}
for op in ("all_reduce", "broadcast", "all_gather"):
    s, g = by.get((op, "shm", 64 << 20)), by.get((op, "gloo", 64 << 20))
    if s and g:
        extra = f"; staged {st[(op, 64 << 20)]:.2f} GB/s" if (op, 64 << 20) in st else ""
        print(f"{op} 64 MiB: shm {s:.2f} GB/s, gloo {g:.2f} GB/s, shm/gloo {s / g:.1f}x{extra}")
EOF
fi
if [ "$device" = cuda ] && [ "$nccl_ranks" -ge 1 ]; then
  check "bench: nccl, $nccl_ranks rank(s), one GPU each" "all_reduce +nccl +67108864" \
    "$lspawn" --nprocs "$nccl_ranks" "$bench" --device cuda --backends nccl --min-bytes 1M --max-bytes 64M --step 8 \
    --json "$out/bench-cuda-nccl-n$nccl_ranks.json" --label "cuda-nccl-n$nccl_ranks"
else
  skip "bench: nccl" "needs CUDA"
fi

# 2. DDP: NCCL by default when the model is on CUDA (docs/strategies.md#ddp), one rank per GPU.
if [ "$device" = cuda ]; then
  for p in 32-true bf16-mixed 16-mixed; do
    check "DDP, digits, cuda, $p, $nccl_ranks rank(s): the default backend is nccl" \
      "DDP on cuda:0, $p, backend nccl, $nccl_ranks ranks && test accuracy 0\.(8|9)" \
      "$lspawn" --nprocs "$nccl_ranks" "$digits" --csv "$csv" --accelerator cuda --precision "$p" --epochs 15
  done
else
  skip "DDP's nccl default" "needs CUDA"
fi
# Several ranks on one device: LSPAWN_BACKEND=shm (NCCL refuses two ranks on one GPU).
check "DDP, digits, $device, 2 ranks on one device, LSPAWN_BACKEND=shm" \
  "DDP on $device(:0)?, 32-true, backend shm\+gloo, 2 ranks && test accuracy 0\.(8|9)" \
  env LSPAWN_BACKEND=shm "$lspawn" --nprocs 2 "$digits" --csv "$csv" --accelerator "$device" --epochs 15
check "DDPSpawn, digits, $device, 2 workers (LSPAWN_BACKEND=shm): the caller gets rank 0's weights" \
  "DDPSpawn \(2 workers, spawn, $device, 32-true\) && test accuracy 0\.(8|9)" \
  env LSPAWN_BACKEND=shm "$digits" --csv "$csv" --spawn 2 --accelerator "$device" --epochs 15

# 3. An unmodified torch script under lspawn: NCCL on CUDA, gloo on the CPU.
script=$out/torch_ddp_script.py
cat > "$script" <<'EOF'
import os, sys, torch, torch.distributed as dist
cuda = sys.argv[1] == "cuda"
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2).to(dev), device_ids=[dev.index] if cuda else None)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(16, 8, device=dev)).sum().backward()
    opt.step()
w = model.module.weight.detach().clone()
dist.all_reduce(w)
same = torch.allclose(w / world, model.module.weight.detach())
print(f"torch {torch.__version__} rank {rank}/{world} backend {dist.get_backend()} on {dev}: replicas equal {same}", flush=True)
dist.destroy_process_group()
sys.exit(0 if same else 3)
EOF
if [ -n "$py" ]; then
  n=$([ "$device" = cuda ] && echo "$nccl_ranks" || echo 2)
  check "torch DDP script ($py) under lspawn, $device, $n rank(s)" "replicas equal True" \
    "$lspawn" --nprocs "$n" "$py" "$script" "$device"
else
  skip "torch DDP script" "no python3"
fi

# 4. --nproc-per-node gpu counts the visible GPUs.
if [ "$device" = cuda ]; then
  check "--nproc-per-node gpu starts one worker per GPU ($gpus)" "WORLD_SIZE=$gpus\$" \
    "$lspawn" --nproc-per-node gpu sh -c 'echo WORLD_SIZE=$WORLD_SIZE'
else
  fails "--nproc-per-node gpu without a GPU is a usage error" "no NVIDIA GPU is visible" \
    env CUDA_VISIBLE_DEVICES= "$lspawn" --nproc-per-node gpu true
fi

# 5. --preload torch: a preloaded module that initialised CUDA at import is refused before any
#    fork (a CUDA context does not survive one); torch alone is preloaded and forked.
if [ -n "$py" ]; then
  moddir=$out/preload-modules; mkdir -p "$moddir"
  printf 'import torch\ntorch.cuda.init()\n' > "$moddir/cuda_at_import.py"
  printf 'import os, torch\nprint("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "preloaded", flush=True)\n' \
    > "$out/preload_worker.py"
  check "--preload torch: workers forked from one interpreter, torch imported once" "rank [01] of 2 preloaded" \
    "$lspawn" --nprocs 2 --preload torch "$py" "$out/preload_worker.py"
  if [ "$device" = cuda ]; then
    fails "--preload of a module that initialised CUDA is refused, naming it" "cuda_at_import.*initialised CUDA" \
      env PYTHONPATH="$moddir" "$lspawn" --nprocs 2 --preload torch,cuda_at_import "$py" "$out/preload_worker.py"
  else
    skip "--preload CUDA refusal" "needs CUDA"
  fi
  # --preload torch,lightning with workers on CUDA. On a machine with an NVIDIA GPU, importing
  # Lightning starts a thread that is not Python's: the server refuses, naming it (the first log
  # records the names); LSPAWN_PRELOAD_ALLOW_THREADS=1 forks anyway, and the workers use CUDA.
  if [ "$device" = cuda ] && "$py" -c 'import lightning' > /dev/null 2>&1; then
    printf '%s\n' 'import os, torch' 'd = torch.device("cuda", 0)' \
      'print("rank", os.environ["RANK"], "cuda sum", torch.ones(1024, device=d).sum().item(), flush=True)' \
      > "$out/preload_cuda_worker.py"
    timeout -k 5 120 "$lspawn" --nprocs 2 --preload torch,lightning "$py" "$out/preload_cuda_worker.py" \
      > "$(logname "--preload torch,lightning, no escape hatch")" 2>&1
    note "INFO --preload torch,lightning without LSPAWN_PRELOAD_ALLOW_THREADS: exit $? ($(grep -Eo "refused: .*|rank 0 cuda sum.*" "$(logname "--preload torch,lightning, no escape hatch")" | head -1 | cut -c1-200))"
    check "--preload torch,lightning, LSPAWN_PRELOAD_ALLOW_THREADS=1: forked workers use CUDA" \
      "rank 0 cuda sum 1024.0 && rank 1 cuda sum 1024.0" \
      env LSPAWN_PRELOAD_ALLOW_THREADS=1 "$lspawn" --nprocs 2 --preload torch,lightning "$py" "$out/preload_cuda_worker.py"
  fi
fi

# 6. --virtual-local-rank (torchrun's): LOCAL_RANK=0 and one visible device per worker; here both
#    workers get the one GPU as their cuda:0 (CUDA_VISIBLE_DEVICES=0,0: entry LOCAL_RANK each).
if [ -n "$py" ]; then
  printf '%s
' 'import os, torch' 'n = torch.cuda.device_count()'     'if n: torch.ones(4, device="cuda:0").sum().item()'     'print("rank", os.environ["RANK"], "LOCAL_RANK", os.environ["LOCAL_RANK"], "CUDA_VISIBLE_DEVICES", os.environ["CUDA_VISIBLE_DEVICES"], "devices", n, flush=True)'     > "$out/virtual_worker.py"
  # With --device cpu on a machine with a GPU (e2e.gpu_session_script_on_cpu there), what torch sees.
  want=$([ "$device" = cuda ] && echo 1 || CUDA_VISIBLE_DEVICES=0 "$py" -c 'import torch; print(min(torch.cuda.device_count(), 1))' 2>/dev/null || echo 0)
  check "--virtual-local-rank: LOCAL_RANK=0, one visible device per worker ($want here)"     "rank 0 LOCAL_RANK 0 CUDA_VISIBLE_DEVICES 0 devices $want\$ && rank 1 LOCAL_RANK 0 CUDA_VISIBLE_DEVICES 0 devices $want\$"     env CUDA_VISIBLE_DEVICES=0,0 "$lspawn" --nprocs 2 --virtual-local-rank "$py" "$out/virtual_worker.py"
fi

# 7. The hang report on World::pg over NCCL (#34, runtime/recorded_backend.hpp: NCCL's ops are
#    polled for completion): rank 1 never enters the third all_reduce, rank 0 waits in it. Needs two
#    GPUs (NCCL refuses two ranks on one device).
hang_worker=$build/tests/e2e/lspawn_test_hang_worker
if [ "$device" = cuda ] && [ "$nccl_ranks" -ge 2 ] && [ -x "$hang_worker" ]; then
  check "hang report on World::pg over nccl, $nccl_ranks ranks: the waiting ranks named, exit 124" \
    "waiting: rank.* in all_reduce #3 on group world.pg && behind: rank 1 has not entered a collective && ^lspawn exit 124\$" \
    sh -c '"$@"; echo "lspawn exit $?"' sh \
    env LSPAWN_BACKEND=nccl "$lspawn" --nprocs "$nccl_ranks" --hang-timeout 3 --grace-period 2 "$hang_worker" pg-never-enters 1 2
else
  skip "hang report on World::pg over nccl" "needs 2 GPUs and the test build (the gloo case runs in the e2e suite)"
fi

echo
echo "# gpu-check summary: $passed passed, $failed failed, $skipped skipped (logs: $out)"
printf '%s' "$summary"
printf '%s' "$summary" > "$out/summary.txt"
[ "$own_out" = 1 ] && [ "$failed" = 0 ] && rm -rf "$out"
exit "$failed"
