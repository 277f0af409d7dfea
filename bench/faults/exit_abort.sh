#!/bin/bash
# exit_abort.sh LSPAWN — does an unmodified Lightning DDP job abort at exit (#47 item 7)?
#
# A rank of a 2-rank CPU Lightning fit (bench/faults/lightning_fit.py: strategy="ddp", gloo, torch
# 2.x) was seen to print its last line and then die of SIGABRT ("terminate called without an active
# exception", job exit 134). This runs that job N times under each variant, one job at a time,
# interleaved (site, nosite, torchrun, site, ...), and counts how each ended:
#   site      lspawn --nprocs 2 PY fit.py               (lspawn's Python site hook on: lspawn_hang)
#   nosite    LSPAWN_PYTHON_SITE=0 lspawn --nprocs 2 …   (the hook off: the script runs as it is)
#   torchrun  PY -m torch.distributed.run --standalone --nproc-per-node 2 fit.py
# With TRIGGER=1 each job is preceded by another torch job whose 2 workers exit just before it
# (the reported trigger: a 2.15 job's workers had exited on the machine just before).
# A rank that aborts leaves a core (ulimit -c, core_pattern "core": the job's own folder); its
# threads' backtraces are written to $KEEP/<variant>-<i>.bt and the output to <variant>-<i>.log.
#
#   bench/faults/exit_abort.sh /work/main/build/launcher/lspawn
#   N=40 VARIANTS="site nosite" TRIGGER=1 bench/faults/exit_abort.sh build/launcher/lspawn
# Environment: N (jobs per variant; 20), VARIANTS ("site nosite torchrun"), TRIGGER (0), PROGRESS
# (a file that gets a line per job as it ends; default stderr),
# TORCH_PY (/work/main/.deps/torch2/bin/python), KEEP (where failed jobs' logs and backtraces go;
# a new folder under /tmp). PYTHONPATH must hold lspawn's python/ when the lspawn binary is a build
# tree's (as for the tests); LSPAWN_GUARDIAN likewise.
# Prints a markdown table: per variant, jobs, exit 0, exit 134 (or other codes), ranks that printed
# `terminate called`, ranks that printed their last line in the failed jobs.
set -uo pipefail
LSPAWN=$(realpath "${1:?usage: exit_abort.sh LSPAWN}")
HERE=$(cd "$(dirname "$0")" && pwd)
FIT=$HERE/lightning_fit.py
N=${N:-20} VARIANTS=${VARIANTS:-site nosite torchrun} TRIGGER=${TRIGGER:-0}
TORCH_PY=${TORCH_PY:-/work/main/.deps/torch2/bin/python}
KEEP=${KEEP:-$(mktemp -d /tmp/lspawn-exit-abort-XXXXXX)}
mkdir -p "$KEEP"
export OMP_NUM_THREADS=1
ulimit -c unlimited 2>/dev/null || echo "exit_abort.sh: no core files (ulimit -c)" >&2

if [[ -n ${PROGRESS:-} ]]; then exec {progress_fd}>>"$PROGRESS"; else progress_fd=2; fi
declare -A jobs ok codes term lastline
for v in $VARIANTS; do jobs[$v]=0 ok[$v]=0 codes[$v]="" term[$v]=0 lastline[$v]=0; done

trigger() {  # another torch job whose 2 workers init gloo and exit
  timeout 120 "$TORCH_PY" -m torch.distributed.run --standalone --nproc-per-node 2 "$HERE/allreduce_worker.py" \
    >/dev/null 2>&1 || true
}

run_one() {  # run_one VARIANT DIR: the job's exit code; its output in DIR/out
  local v=$1 dir=$2
  case $v in
    site) (cd "$dir" && timeout 300 "$LSPAWN" --nprocs 2 "$TORCH_PY" "$FIT") >"$dir/out" 2>&1 ;;
    nosite) (cd "$dir" && LSPAWN_PYTHON_SITE=0 timeout 300 "$LSPAWN" --nprocs 2 "$TORCH_PY" "$FIT") >"$dir/out" 2>&1 ;;
    torchrun) (cd "$dir" && timeout 300 "$TORCH_PY" -m torch.distributed.run --standalone --nproc-per-node 2 "$FIT") \
      >"$dir/out" 2>&1 ;;
  esac
}

for ((i = 1; i <= N; i++)); do
  for v in $VARIANTS; do
    dir=$(mktemp -d /tmp/lspawn-exit-abort-job-XXXXXX)
    [[ $TRIGGER == 1 ]] && trigger
    run_one "$v" "$dir"
    rc=$?
    jobs[$v]=$((jobs[$v] + 1))
    t=$(grep -c "terminate called" "$dir/out")
    if ((rc == 0 && t == 0)); then
      ok[$v]=$((ok[$v] + 1))
    else
      codes[$v]+="${codes[$v]:+ }$rc"
      term[$v]=$((term[$v] + t))
      lastline[$v]=$((lastline[$v] + $(grep -c "done loss" "$dir/out")))
      cp "$dir/out" "$KEEP/$v-$i.log"
      for core in "$dir"/core*; do
        [[ -f $core ]] || continue
        gdb -batch -ex "info threads" -ex "thread apply all bt 30" "$TORCH_PY" "$core" >"$KEEP/$v-$i.bt" 2>&1
      done
      echo "exit_abort.sh: $v job $i exited $rc (terminate called: $t); $KEEP/$v-$i.*" >&2
    fi
    # One line per job, as it ends (PROGRESS, default stderr): a run stopped early still has its counts.
    echo "exit_abort.sh: $(date +%T) $v job $i: exit $rc, terminate called: $t" >&"$progress_fd"
    rm -rf "$dir"
  done
done

echo "| variant | jobs | exit 0 | failed (exit codes) | \`terminate called\` lines | last lines printed in failed jobs |"
echo "|---|---|---|---|---|---|"
for v in $VARIANTS; do
  echo "| $v | ${jobs[$v]} | ${ok[$v]} | $((jobs[$v] - ok[$v]))${codes[$v]:+ (${codes[$v]})} | ${term[$v]} | ${lastline[$v]} |"
done
echo "(TRIGGER=$TRIGGER; failed jobs' logs and backtraces: $KEEP)"
