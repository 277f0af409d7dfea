#!/usr/bin/env bash
# The Python package as a user gets it (docs/python.md; scripts/test.sh runs this once, after the
# LibTorch lines): the wheel built by scripts/build-wheel.sh, installed into a fresh venv that has
# torch (Debian's python3-torch, through --system-site-packages) and nothing of this checkout or
# its build trees on any path, then used from another directory with the checkout out of reach:
# the `lspawn` command, torchrun-style and --preload jobs, a Python hang report, `python -m
# lspawn`, a moved venv, lspawn.spawn() in every start method and its error paths
# (tests/wheel/spawn_cases.py), a damaged install, `pip uninstall` leaving nothing behind, and the
# Linux-only refusal. Every check prints "ok ..." or fails the script naming what it expected.
# Usage: tests/wheel/run.sh [WHEEL]   (default: build one with scripts/build-wheel.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/lspawn-wheel-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "wheel test: FAILED: $*" >&2; exit 1; }
ok() { echo "wheel test: ok $*"; }

wheel=${1:-}
if [[ -z $wheel ]]; then
  wheel=$(bash "$root/scripts/build-wheel.sh" "$work/dist" | tail -1)
fi
[[ -f $wheel ]] || fail "no wheel at '$wheel'"
size_kb=$(du -k "$wheel" | cut -f1)
ok "wheel $(basename "$wheel") ($size_kb KiB)"
((size_kb < 10240)) || fail "the wheel is $size_kb KiB, over the 10 MiB goal"
# The tag docs/python.md promises: a symbol of a newer glibc or libstdc++ (the engine's, a shim's) lifts it.
[[ $(basename "$wheel") == *-manylinux_2_34_x86_64.whl ]] || fail "$(basename "$wheel"): not manylinux_2_34 (auditwheel show says what needs more)"

# What the tests run, copied away from the checkout (nothing of it on any path from here on).
mkdir -p "$work/job"
cp "$root"/tests/wheel/{spawn_cases.py,spawn_fns.py,hello.py,hang.py,backend_hello.py} "$root"/tests/python_mp/mp_test.py "$work/job/"
venv=$work/venv
/usr/bin/python3 -m venv --system-site-packages "$venv"
(cd "$work" && find venv | sort) >"$work/before.txt"
"$venv/bin/pip" install -q --no-index --no-deps --disable-pip-version-check "$wheel"
cd "$work/job"
# A clean environment: the venv first, no PYTHONPATH, no LD_LIBRARY_PATH, no LSPAWN_*.
run() { env -i HOME="$HOME" PATH="$venv/bin:/usr/bin:/bin" TMPDIR="${TMPDIR:-/tmp}" LANG=C.UTF-8 "$@"; }
py=$venv/bin/python

[[ $(run sh -c 'command -v lspawn') == "$venv/bin/lspawn" ]] || fail "lspawn on PATH is not the venv's"
version=$(run "$py" -c 'import lspawn; print(lspawn.__version__)')
[[ $(run lspawn --version) == "lspawn $version" ]] || fail "lspawn --version: '$(run lspawn --version)', the package says $version"
[[ $(head -c 4 "$venv/bin/lspawn" | od -An -c | tr -d ' ') == '177ELF' ]] || fail "$venv/bin/lspawn is not the native binary"
if strings "$venv/bin/lspawn" "$venv"/lib/python3*/site-packages/lspawn/libexec/lspawn-guardian \
     "$venv"/lib/python3*/site-packages/lspawn/lib/liblspawn_preload.so | grep -F -e "$root" -e /usr/local/lib/lspawn -e /usr/local/libexec; then
  fail "a shipped binary names the checkout or an install prefix (above)"
fi
run "$py" -c 'import lspawn, sys; assert not any(p.startswith(sys.argv[1]) for p in sys.path), sys.path' "$root"
ok "lspawn --version ($version) from $venv/bin, native, no build or install path inside"

# The program of this worker's lspawn's guardian (the process whose parent is the worker's parent,
# lspawn): other lspawns may run beside this test (ctest -j), each with its guardian.
own_guardian='for p in /proc/[0-9]*; do [ "$(awk "/^PPid:/{print \$2}" "$p/status" 2>/dev/null)" = "$PPID" ] && readlink "$p/exe"; done | grep lspawn-guardian'
# The guardian the launcher runs is the package's (not a fork of lspawn).
out=$(run lspawn --nprocs 1 --quiet --no-prefix sh -c "$own_guardian")
[[ $out == "$venv"/lib/python3*/site-packages/lspawn/libexec/lspawn-guardian ]] || fail "guardian: expected the package's, got '$out'"
ok "the guardian is the package's: $out"

# torchrun's command line, then --preload torch: a real gloo all_reduce across 2 ranks.
out=$(run lspawn --standalone --nproc-per-node 2 "$py" hello.py 2>&1) || fail "torchrun-style job: $out"
grep -q "rank 0 of 2: sum 1" <<<"$out" && grep -q "rank 1 of 2: sum 1" <<<"$out" || fail "torchrun-style job: $out"
ok "lspawn --standalone --nproc-per-node 2 hello.py"
out=$(run lspawn --preload torch --nprocs 2 "$py" hello.py 2>&1) || fail "--preload torch: $out"
grep -q "preloaded: torch" <<<"$out" && grep -q "rank 1 of 2: sum 1" <<<"$out" || fail "--preload torch: $out"
ok "lspawn --preload torch --nprocs 2 hello.py"
out=$(run "$py" -m lspawn --nprocs 2 "$py" hello.py 2>&1) || fail "python -m lspawn: $out"
grep -q "rank 1 of 2: sum 1" <<<"$out" || fail "python -m lspawn: $out"
[[ $(run "$py" -m lspawn --version) == "lspawn $version" ]] || fail "python -m lspawn --version"
ok "python -m lspawn"

# The Python hang report: rank 1 sleeps between two all_reduces.
set +e
out=$(run timeout 60 lspawn --preload torch --nprocs 3 --hang-timeout 3 "$py" hang.py 2>&1)
rc=$?
set -e
((rc == 124)) || fail "hang: exit $rc, expected 124: $out"
grep -q "behind: rank 1" <<<"$out" && grep -q "main thread of rank 1 (pid" <<<"$out" && grep -q "hang.py\", line " <<<"$out" || fail "hang report: $out"
ok "--hang-timeout: the hang report names rank 1 and its stack (exit 124)"
# The same in exec mode, the command line unchanged (a fresh interpreter per rank): the package's
# lspawn_site/sitecustomize.py installs lspawn_hang (launcher/python_site.hpp).
set +e
out=$(run timeout 90 lspawn --nprocs 3 --hang-timeout 3 "$py" hang.py 2>&1)
rc=$?
set -e
((rc == 124)) || fail "hang, exec mode: exit $rc, expected 124: $out"
grep -q "behind: rank 1" <<<"$out" && grep -q "hang.py\", line " <<<"$out" || fail "hang report, exec mode: $out"
ok "lspawn python hang.py: the same report in exec mode, from the wheel's sitecustomize"

# lspawn.spawn(): every start method, its error paths, bad input (spawn_cases.py prints its own oks).
run "$py" spawn_cases.py || fail "spawn_cases.py"
# `import lspawn as mp` as torch.multiprocessing, from the wheel (tests/python_mp/mp_test.py): torch's spawn tests
# restated with preload=["torch"] (the package's preload server and launcher), and the cases run once (the guard, a
# notebook's function with Debian's cloudpickle, install(), fork's refusals, a running `lspawn daemon`). The same
# contract in spawn, forkserver and fork is python_mp.torch's, with this Python and torch (1.13 line), and the
# package's guardian under every start method is spawn_cases.py's above: ~22 s less here (CI time, #46).
out=$(run "$py" mp_test.py TorchContractPreload Once 2>&1) || { echo "$out" | tail -40; fail "mp_test.py from the wheel"; }
ok "import lspawn as mp, from the wheel: mp_test.py TorchContractPreload Once $(tail -3 <<<"$out" | grep -E '^OK' || echo OK)"

# A moved venv: the binary finds its package from where it is now.
mv "$venv" "$work/moved"
out=$(env -i HOME="$HOME" PATH="$work/moved/bin:/usr/bin:/bin" LANG=C.UTF-8 "$work/moved/bin/lspawn" --preload json --nprocs 2 /usr/bin/python3 hello.py --no-torch 2>&1) ||
  fail "moved venv: $out"
grep -q "rank 1 of 2: ok" <<<"$out" || fail "moved venv: $out"
mv "$work/moved" "$venv"
ok "a moved venv: lspawn --preload still finds its server"

# A damaged install: the missing file is named, with where it was looked for.
pkg=$(echo "$venv"/lib/python3*/site-packages/lspawn)
mv "$pkg/lspawn_preload.py" "$work/saved.py"
set +e
out=$(run lspawn --preload json --nprocs 1 "$py" hello.py --no-torch 2>&1)
rc=$?
set -e
mv "$work/saved.py" "$pkg/lspawn_preload.py"
((rc != 0)) && grep -q "is missing: lspawn_preload.py (looked for .*$pkg/lspawn_preload.py" <<<"$out" ||
  fail "damaged install: exit $rc: $out"
ok "a damaged install names the missing file and where: $(grep -o 'missing: .*' <<<"$out" | cut -c1-100)..."
mv "$pkg/libexec/lspawn-guardian" "$work/saved-guardian"
set +e
out=$(run "$py" -c 'import lspawn; lspawn.spawn(print, nprocs=1, start_method="fork")' 2>&1)
rc=$?
set -e
mv "$work/saved-guardian" "$pkg/libexec/lspawn-guardian"
((rc != 0)) && grep -q "$pkg/libexec/lspawn-guardian" <<<"$out" || fail "lspawn.spawn without its guardian: exit $rc: $out"
ok "lspawn.spawn() without its guardian names the file"

# The torch.distributed backend `lspawn` as the wheel ships it (docs/python-backend.md): the shim built for
# this Python's torch (Debian's 1.13) and the engine, nothing built here. Under lspawn, explicitly and through
# --cpu-backend lspawn with a script that says gloo.
run "$py" -c 'import lspawn, sys; assert "torch" not in sys.modules, "import lspawn imported torch"' ||
  fail "import lspawn imports torch"
out=$(run lspawn --nprocs 2 "$py" backend_hello.py lspawn 2>&1) || fail "backend lspawn: $out"
grep -q "rank 0 of 2: sum 3 on shm" <<<"$out" && grep -q "rank 1 of 2: sum 3 on shm" <<<"$out" || fail "backend lspawn: $out"
ok "init_process_group(\"lspawn\") from the wheel's shim: shm"
out=$(run lspawn --cpu-backend lspawn --nprocs 2 "$py" backend_hello.py gloo 2>&1) || fail "--cpu-backend lspawn: $out"
[[ $(grep -c "sum 3 on shm" <<<"$out") == 2 ]] || fail "--cpu-backend lspawn: $out"
ok "lspawn --cpu-backend lspawn: an init_process_group(\"gloo\") script on shm"
# torch 2.15 (the 2.x line's venv of scripts/setup-torch2.sh, when there): the wheel installed into a folder
# of its own, under torchrun's own launcher: "cpu:lspawn,cuda:nccl" where a GPU is (torch 2.15 refuses
# cuda:nccl without a CUDA device, "cpu:gloo,cuda:nccl" as well), "cpu:lspawn" otherwise.
t2=$root/.deps/torch2/bin
if [[ -x $t2/python ]] && "$t2/python" -c 'import torch' 2>/dev/null; then
  "$t2/python" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$work/t2" "$wheel"
  spec=cpu:lspawn
  "$t2/python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && spec=cpu:lspawn,cuda:nccl
  out=$(run env PYTHONPATH="$work/t2" "$t2/torchrun" --standalone --nproc-per-node 2 \
    --log-dir "$work/torchrun-logs" backend_hello.py "$spec" 2>&1) ||
    fail "torchrun, $spec: $out"
  [[ $(grep -o "sum 3 on shm" <<<"$out" | wc -l) == 2 ]] || fail "torchrun, $spec: $out"  # torchrun does not keep lines whole
  ok "torch 2.15 under torchrun: init_process_group(\"$spec\") from the wheel's shim: shm"
else
  echo "wheel test: torch 2.15's venv is absent (.deps/torch2): its torchrun check is skipped"
fi

# pip uninstall leaves nothing behind (the package's __pycache__ included).
run "$venv/bin/pip" uninstall -y -q lspawn
(cd "$work" && find venv | sort) >"$work/after.txt"
diff "$work/before.txt" "$work/after.txt" || fail "pip uninstall left the files above"
ok "pip uninstall lspawn leaves the venv as it was"

# Linux only: another platform is refused at configure time, in one line.
set +e
out=$(cmake -S "$root" -B "$work/darwin" -DCMAKE_SYSTEM_NAME=Darwin -DLSPAWN_LAUNCHER_ONLY=ON 2>&1)
rc=$?
set -e
((rc != 0)) && grep -q "lspawn is Linux-only" <<<"$out" || fail "non-Linux configure: exit $rc: $out"
ok "another platform: 'lspawn is Linux-only'"
