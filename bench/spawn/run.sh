#!/usr/bin/env bash
# spawn() vs torch.multiprocessing.spawn, same job, one run: N ranks each form a gloo process
# group and pass a barrier; median ms from the spawn call to the last rank past the barrier.
# Then the memory (PSS) of 4 workers holding one ~512 MB model.
# Usage: bench/spawn/run.sh [build-dir] [nprocs] [runs]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
nprocs=${2:-8}
runs=${3:-10}
bin=$build/bench/spawn
echo "# machine: $(nproc) cores, $(uname -r); BLAS: $(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || echo unknown)"
echo "# job: $nprocs ranks, gloo process group + barrier, $runs runs each"
lines=()
lines+=("$("$bin/spawn_barrier_bench" --nprocs "$nprocs" --runs "$runs" --method fork | tail -1)")
lines+=("$("$bin/spawn_barrier_bench" --nprocs "$nprocs" --runs "$runs" --method forkserver | tail -1)")
lines+=("$("$bin/spawn_barrier_bench" --nprocs "$nprocs" --runs "$runs" --method spawn | tail -1)")
lines+=("$(/usr/bin/python3 "$here/torch_mp_barrier.py" --nprocs "$nprocs" --runs "$runs" --method spawn 2>/dev/null | tail -1)")
lines+=("$(/usr/bin/python3 "$here/torch_mp_barrier.py" --nprocs "$nprocs" --runs "$runs" --method fork 2>/dev/null | tail -1)")
printf '%-28s %-11s %8s %22s %16s\n' tool method nprocs "median ms to barrier" "median ms total"
for l in "${lines[@]}"; do
  tool=${l%% *}
  method=$(sed -n 's/.*method=\([^ ]*\).*/\1/p' <<<"$l")
  n=$(sed -n 's/.*nprocs=\([^ ]*\).*/\1/p' <<<"$l")
  b=$(sed -n 's/.*median_ms_to_barrier=\([^ ]*\).*/\1/p' <<<"$l")
  t=$(sed -n 's/.*median_ms_total=\([^ ]*\).*/\1/p' <<<"$l")
  printf '%-28s %-11s %8s %22s %16s\n' "$tool" "$method" "$n" "$b" "$t"
done
echo
echo "# memory: 4 workers holding one model (PSS from /proc/<pid>/smaps_rollup)"
"$bin/spawn_pss_bench" --nprocs 4 --mb 512
