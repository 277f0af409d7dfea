#!/usr/bin/env bash
# The cross-built wheels of scripts/build-wheel-cross.sh (docs/python.md, "Which wheel"), as a user
# of an older or another Linux gets them:
#   x86_64   the manylinux_2_<G>_x86_64 wheel: no symbol of a glibc newer than 2.<G> in any of its
#            programs or libraries (objdump -T), then installed into a fresh venv here (a newer
#            glibc runs it) and used: `lspawn --version`, a 2-rank Python job, a failing rank's exit
#            code, the package's guardian, --preload, lspawn.spawn() and its ProcessExitedException,
#            and the torch.distributed backend: no shim in the wheel, the one built by `python -m
#            lspawn.distributed build` on the wheel's engine (with Debian's torch 1.13, when there).
#   aarch64  the manylinux_2_<G>_aarch64 wheel, the same symbol check, then its `lspawn` run under
#            qemu-user (binfmt_misc, so that what lspawn execs runs too: its guardian and aarch64
#            workers, tests/wheel/cross_worker.c built by zig): --version, a 2-rank job, a failing
#            rank's exit code, an all_reduce through the wheel's liblspawn_engine.so, its
#            liblspawn_preload.so loaded and called, and the guardian killing the workers of a
#            SIGKILLed launcher; then its Python side in Debian's arm64 python3.11 under qemu
#            (tests/wheel/aarch64-python.sh, a sysroot cached in ~/.cache; skipped when its .debs
#            cannot be downloaded): import lspawn, lspawn.spawn() in start methods spawn, fork
#            and forkserver (values returned, ProcessExitedException), and lspawn --preload.
# Every check prints "ok ..." or fails the script naming what it expected.
# Usage: tests/wheel/cross.sh [x86_64] [aarch64]   (default: both; each builds its wheel)
# Env: LSPAWN_CROSS_GLIBC (default 2.17), LSPAWN_CROSS_PYTHON (the x86_64 venv's Python, default
# /usr/bin/python3; e.g. pyenv's 3.8 for requires-python's oldest), LSPAWN_CROSS_WHEEL_x86_64 /
# LSPAWN_CROSS_WHEEL_aarch64 (a wheel already built: not built again).
# Needs (scripts/install-deps.sh): qemu-user, libc6-arm64-cross (the aarch64 glibc qemu loads),
# llvm (llvm-strip); root for the aarch64 part when qemu-aarch64 is not yet registered with
# binfmt_misc (it registers it, as Debian's qemu-user-binfmt would).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/lspawn-cross-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "cross wheel test: FAILED: $*" >&2; exit 1; }
ok() { echo "cross wheel test: ok $*"; }
glibc=${LSPAWN_CROSS_GLIBC:-2.17}
parts=("$@")
((${#parts[@]})) || parts=(x86_64 aarch64)

# The wheel for ARCH: LSPAWN_CROSS_WHEEL_<arch>, or built now.
wheel_for() {
  local var=LSPAWN_CROSS_WHEEL_$1
  if [[ -n ${!var:-} ]]; then
    echo "${!var}"
  else
    local start=$SECONDS w
    w=$(bash "$root/scripts/build-wheel-cross.sh" "$1-linux-gnu.$glibc" "$work/dist-$1" 2>"$work/build-$1.log" | tail -1) ||
      { tail -30 "$work/build-$1.log" >&2; fail "scripts/build-wheel-cross.sh $1-linux-gnu.$glibc (log above)"; }
    echo "cross wheel test: built $(basename "$w") in $((SECONDS - start)) s" >&2
    echo "$w"
  fi
}

# The wheel unpacked into DIR; every ELF file in it needs glibc 2.<G> at most, and is of ARCH.
check_symbols() {
  local wheel=$1 arch=$2 dir=$3 f newest n=0
  [[ $(basename "$wheel") == *"manylinux_${glibc//./_}_$arch"* ]] || fail "$(basename "$wheel"): not manylinux_${glibc//./_}_$arch"
  /usr/bin/python3 -m zipfile -e "$wheel" "$dir"
  while IFS= read -r f; do
    [[ $(head -c 4 "$f" | od -An -c | tr -d ' ') == '177ELF' ]] || continue
    n=$((n + 1))
    [[ $(file -b "$f") == *"$( [[ $arch == aarch64 ]] && echo aarch64 || echo x86-64)"* ]] || fail "$f is not $arch: $(file -b "$f")"
    newest=$(objdump -T "$f" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
    [[ $(printf '%s\n%s\n' "$newest" "$glibc" | sort -V | tail -1) == "$glibc" ]] ||
      fail "$f needs GLIBC_$newest, newer than the tag's $glibc: $(objdump -T "$f" | grep "GLIBC_$newest" | head -3)"
    # Nothing but glibc: libc++ and libunwind are linked statically, and no torch shim ships.
    if readelf -d "$f" | grep NEEDED | grep -v -E '\[(libc|libm|libpthread|libdl|librt)\.so\.[0-9]+\]|\[ld-linux' >&2; then
      fail "$f needs a library besides glibc's (above)"
    fi
  done < <(find "$dir" -type f)
  ((n >= 4)) || fail "$(basename "$wheel"): $n ELF files, expected the launcher, guardian, preload and engine"
  if find "$dir" -path '*/_shims/*.so' | grep . >&2; then fail "a cross wheel ships a backend shim (above)"; fi
  ok "$(basename "$wheel"): $n native files, all $arch, glibc <= $glibc, nothing but glibc needed, no shim"
}

test_x86_64() {
  local wheel py venv out rc
  wheel=$(wheel_for x86_64)
  check_symbols "$wheel" x86_64 "$work/x86_64-files"
  py=${LSPAWN_CROSS_PYTHON:-/usr/bin/python3}
  venv=$work/venv
  # --system-site-packages: Debian's torch 1.13 for the backend check below.
  "$py" -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q --no-index --no-deps --disable-pip-version-check "$wheel"
  mkdir -p "$work/job" && cp "$root/tests/wheel/hello.py" "$work/job/"
  cd "$work/job"
  run() { env -i HOME="$HOME" PATH="$venv/bin:/usr/bin:/bin" TMPDIR="${TMPDIR:-/tmp}" LANG=C.UTF-8 "$@"; }
  [[ $(run lspawn --version) == "lspawn $(run python -c 'import lspawn; print(lspawn.__version__)')" ]] ||
    fail "lspawn --version: '$(run lspawn --version)'"
  ok "lspawn --version from the manylinux_${glibc//./_} wheel in a venv of $(run python -V)"
  out=$(run lspawn --nprocs 2 python -c 'import os; print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"])' 2>&1) ||
    fail "lspawn --nprocs 2 python: $out"
  grep -q "rank 0 of 2" <<<"$out" && grep -q "rank 1 of 2" <<<"$out" || fail "lspawn --nprocs 2 python: $out"
  ok "lspawn --nprocs 2 python -c ..."
  set +e
  out=$(run lspawn --nprocs 2 python -c 'import os, sys, time; r = int(os.environ["RANK"]); r == 1 and sys.exit(3); time.sleep(60)' 2>&1)
  rc=$?
  set -e
  ((rc == 3)) && grep -q "root cause: process 1 terminated with exit code 3" <<<"$out" || fail "failing rank: exit $rc: $out"
  ok "a rank's sys.exit(3): lspawn exits 3, rank 1 named the root cause"
  out=$(run lspawn --nprocs 1 --quiet --no-prefix sh -c \
    'for p in /proc/[0-9]*; do [ "$(awk "/^PPid:/{print \$2}" "$p/status" 2>/dev/null)" = "$PPID" ] && readlink "$p/exe"; done | grep lspawn-guardian')
  [[ $out == "$venv"/lib/python3*/site-packages/lspawn/libexec/lspawn-guardian ]] || fail "guardian: expected the package's, got '$out'"
  ok "the guardian is the wheel's"
  out=$(run lspawn --preload json --nprocs 2 python hello.py --no-torch 2>&1) || fail "--preload json: $out"
  grep -q "rank 1 of 2: ok" <<<"$out" || fail "--preload json: $out"
  ok "lspawn --preload json (the wheel's liblspawn_preload.so)"
  cat >spawn_job.py <<'EOF'
import os, sys, tempfile
import lspawn

def write(i, folder):
    with open(os.path.join(folder, str(i)), "w") as f:
        f.write(str(os.getpid()))

def fail_one(i):
    if i == 1:
        sys.exit(3)

if __name__ == "__main__":
    folder = tempfile.mkdtemp(dir=".")  # the test's work folder, removed with it
    lspawn.spawn(write, args=(folder,), nprocs=2)
    assert sorted(os.listdir(folder)) == ["0", "1"], os.listdir(folder)
    try:
        lspawn.spawn(fail_one, nprocs=2)
    except lspawn.ProcessExitedException as e:
        assert (e.error_index, e.exit_code) == (1, 3), (e.error_index, e.exit_code)
    else:
        raise AssertionError("spawn of a process that exits 3 did not raise")
    print("spawn ok")
EOF
  out=$(run python spawn_job.py 2>&1) || fail "lspawn.spawn: $out"
  grep -q "spawn ok" <<<"$out" || fail "lspawn.spawn: $out"
  ok "lspawn.spawn(fn, nprocs=2) and a process's exit 3 as ProcessExitedException(error_index=1, exit_code=3)"
  # The backend without a shim in the wheel: the missing shim named with the command that builds
  # it, then that command, and the wheel's zig-built engine (libc++ inside) under torch's shim.
  if run python -c 'import torch' 2>/dev/null; then
    cp "$root/tests/wheel/backend_hello.py" .
    run() { env -i HOME="$HOME" PATH="$venv/bin:/usr/bin:/bin" TMPDIR="${TMPDIR:-/tmp}" LANG=C.UTF-8 \
      LSPAWN_BACKEND_SHIM_DIR="$work/shims" "$@"; }
    set +e
    out=$(run lspawn --nprocs 1 python backend_hello.py lspawn 2>&1)
    rc=$?
    set -e
    ((rc != 0)) && grep -q "has no build for torch" <<<"$out" && grep -q "python -m lspawn.distributed build" <<<"$out" ||
      fail "backend lspawn with no shim: exit $rc: $out"
    ok "init_process_group(\"lspawn\") with no shim names 'python -m lspawn.distributed build'"
    # As a user with a compiler cache builds it (CXX="ccache c++"; ~25 s without): the compile is
    # one step of its own (the link another), and the paths under $work are made relative.
    local cc_env=()
    if command -v ccache > /dev/null; then
      cc_env=(CXX="ccache c++" CCACHE_DIR="$(ccache --get-config cache_dir)" CCACHE_BASEDIR="$work" CCACHE_NOHASHDIR=1)
    fi
    out=$(run "${cc_env[@]}" python -m lspawn.distributed build 2>&1) || fail "python -m lspawn.distributed build: $out"
    out=$(run lspawn --nprocs 2 python backend_hello.py lspawn 2>&1) || fail "backend lspawn: $out"
    [[ $(grep -c "sum 3 on shm" <<<"$out") == 2 ]] || fail "backend lspawn: $out"
    ok "the shim built on the target: init_process_group(\"lspawn\") on the wheel's engine: shm"
  else
    echo "cross wheel test: $("$venv/bin/python" -V) has no torch: the backend check is skipped"
  fi
  cd "$root"
}

# qemu-aarch64 as binfmt_misc's interpreter of aarch64 ELF files: lspawn execs its guardian and
# its workers, and a qemu-user process runs only the one program it was started with.
register_qemu_aarch64() {
  local binfmt=/proc/sys/fs/binfmt_misc
  [[ -e $binfmt/qemu-aarch64 ]] && grep -q enabled "$binfmt/qemu-aarch64" && return 0
  command -v qemu-aarch64 >/dev/null || fail "no qemu-aarch64 (Debian: apt-get install qemu-user; scripts/install-deps.sh)"
  [[ $(id -u) == 0 ]] || fail "qemu-aarch64 is not registered with binfmt_misc, and registering it needs root"
  [[ -e $binfmt/register ]] || mount -t binfmt_misc binfmt_misc "$binfmt" ||
    fail "cannot mount binfmt_misc on $binfmt"
  # qemu's own magic and mask for aarch64 (its scripts/qemu-binfmt-conf.sh); the kernel decodes \x.
  echo ':qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:'"$(command -v qemu-aarch64)"':' >"$binfmt/register" ||
    fail "registering qemu-aarch64 with binfmt_misc failed"
  echo "cross wheel test: registered $(command -v qemu-aarch64) for aarch64 programs with binfmt_misc" >&2
}

test_aarch64() {
  local wheel prefix lspawn worker engine out rc pids pid p alive guardian
  wheel=$(wheel_for aarch64)
  check_symbols "$wheel" aarch64 "$work/aarch64-files"
  register_qemu_aarch64
  # The aarch64 glibc the dynamic programs need (the zig-built ones link glibc dynamically).
  export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
  [[ -e $QEMU_LD_PREFIX/lib/ld-linux-aarch64.so.1 ]] ||
    fail "no aarch64 glibc in $QEMU_LD_PREFIX (Debian: apt-get install libc6-arm64-cross)"
  # The wheel laid out as pip would install it into a prefix: <prefix>/bin/lspawn, the package in
  # <prefix>/lib/python3.X/site-packages (supervisor/install_layout.hpp finds it from there).
  prefix=$work/aarch64-prefix
  mkdir -p "$prefix/bin" "$prefix/lib/python3.11"
  cp -r "$work/aarch64-files" "$prefix/lib/python3.11/site-packages"
  mv "$prefix"/lib/python3.11/site-packages/lspawn-*.data/scripts/lspawn "$prefix/bin/lspawn"
  # What pip does besides: the .data folder emptied away, the script's RECORD entry made the path
  # it was moved to (lspawn._paths finds the launcher by it).
  rm -r "$prefix"/lib/python3.11/site-packages/lspawn-*.data
  sed -i 's|^lspawn-[^/]*\.data/scripts/lspawn,|../../../bin/lspawn,|' "$prefix"/lib/python3.11/site-packages/lspawn-*.dist-info/RECORD
  lspawn=$prefix/bin/lspawn
  # zipfile -e keeps no modes; pip sets these two executable from the wheel's.
  chmod +x "$lspawn" "$prefix"/lib/python3.11/site-packages/lspawn/libexec/lspawn-guardian
  engine=$(echo "$prefix"/lib/python3.11/site-packages/lspawn/lib/liblspawn_engine.so)
  worker=$work/cross_worker
  "$root/.deps/zig/bin/zig" cc \
    --target="aarch64-linux-gnu.$glibc" -O2 -Wall -Wextra -Werror "$root/tests/wheel/cross_worker.c" -ldl -o "$worker"
  [[ $(file -b "$worker") == *aarch64* ]] || fail "$worker is not aarch64: $(file -b "$worker")"
  out=$("$lspawn" --version) || fail "lspawn --version under qemu-aarch64: $out"
  [[ $out == "lspawn "* ]] || fail "lspawn --version: '$out'"
  ok "$out: the aarch64 lspawn under qemu-aarch64 ($(qemu-aarch64 --version | head -1))"
  out=$("$lspawn" --nprocs 2 "$worker" rank 2>&1) || fail "lspawn --nprocs 2 cross_worker rank: $out"
  grep -q "\[rank 0\] rank 0 of 2 on aarch64" <<<"$out" && grep -q "\[rank 1\] rank 1 of 2 on aarch64" <<<"$out" ||
    fail "lspawn --nprocs 2 cross_worker rank: $out"
  ok "lspawn --nprocs 2: two aarch64 workers, prefixed output"
  set +e
  out=$(timeout 120 "$lspawn" --nprocs 3 --grace-period 5 "$worker" fail 7 2>&1)
  rc=$?
  set -e
  ((rc == 7)) && grep -q "root cause: process 1 terminated with exit code 7" <<<"$out" || fail "failing rank: exit $rc: $out"
  ok "a rank's exit 7: lspawn exits 7, rank 1 named the root cause, the others stopped"
  mkdir -p "$work/store"
  out=$("$lspawn" --nprocs 2 "$worker" all_reduce "$engine" "$work/store" "lspawn-cross-$$" 2>&1) ||
    fail "all_reduce through the engine: $out"
  [[ $(grep -c "all_reduce sum 3 on shm" <<<"$out") == 2 ]] || fail "all_reduce through the engine: $out"
  ok "an all_reduce of 2 ranks through the wheel's aarch64 liblspawn_engine.so (float32, int64)"
  out=$("$lspawn" --nprocs 1 "$worker" preload "${engine%/*}/liblspawn_preload.so" 2>&1) || fail "the preload library: $out"
  grep -q "preload library: [0-9]* threads, [0-9]* after fork" <<<"$out" || fail "the preload library: $out"
  ok "the wheel's aarch64 liblspawn_preload.so loads and runs"
  # The guardian: the launcher SIGKILLed, its workers are killed all the same.
  mkdir -p "$work/pids"
  "$lspawn" --quiet --nprocs 2 "$worker" sleep "$work/pids" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 300); do [[ $(cat "$work"/pids/* 2>/dev/null | wc -l) == 4 ]] && break; sleep 0.1; done
  pids="$(cat "$work"/pids/* 2>/dev/null | tr '\n' ' ')" || true
  [[ $pids =~ ^([0-9]+\ ){4}$ ]] || fail "the sleeping workers and their children did not write their pids: '$pids'"
  # The job's guardian is the wheel's aarch64 one, run by qemu too (binfmt_misc: its cmdline is
  # qemu's, then the program's path).
  guardian=$(grep -l -a -F "$prefix/lib/python3.11/site-packages/lspawn/libexec/lspawn-guardian" /proc/[0-9]*/cmdline 2>/dev/null | head -1) ||
    true
  [[ -n $guardian ]] || fail "no process runs the wheel's lspawn-guardian while the job sleeps"
  ok "the guardian is the wheel's, under qemu: $(tr '\0' ' ' <"$guardian" | sed "s|$work|<tmp>|g")"
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    alive=0
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for p in $pids; do
    if kill -0 "$p" 2>/dev/null; then kill -KILL $pids 2>/dev/null; fail "process $p of the job outlived its SIGKILLed launcher by 10 s (no guardian?)"; fi
  done
  # The workers have PR_SET_PDEATHSIG; their children have not: the guardian killed those.
  ok "lspawn SIGKILLed: its workers and their children are gone (the children by the guardian)"
  test_aarch64_python "$prefix"
}

# The aarch64 wheel's Python side under qemu: Debian's arm64 python3.11 in a sysroot of its own
# (tests/wheel/aarch64-python.sh; cached, ~20 s the first time), PREFIX made a venv of it. The
# workers are aarch64 Pythons started by the aarch64 lspawn (binfmt_misc, QEMU_LD_PREFIX=the
# sysroot in their environment). Skipped, not failed, when the arm64 packages cannot be downloaded.
# qemu-user runs a thread of its own in every process (its RCU thread: /proc/self/task lists 2
# in a Python that started none), which lspawn's fork-safety checks see as a native thread: the
# fork warning of spawn(start_method="fork"), and --preload's server refusing to fork, are qemu's,
# not the wheel's; LSPAWN_PRELOAD_ALLOW_THREADS=1 forks past it.
test_aarch64_python() {
  local prefix=$1 sysroot out rc start=$SECONDS
  set +e
  sysroot=$(bash "$root/tests/wheel/aarch64-python.sh" --sysroot 2>"$work/aarch64-python.log")
  rc=$?
  set -e
  if ((rc == 3)); then
    echo "cross wheel test: SKIPPED the aarch64 wheel's Python side (lspawn.spawn, --preload under qemu):" \
      "the arm64 python3.11 packages could not be downloaded: $(tail -3 "$work/aarch64-python.log" | tr '\n' ' ')"
    return 0
  fi
  ((rc == 0)) || { cat "$work/aarch64-python.log" >&2; fail "tests/wheel/aarch64-python.sh (log above)"; }
  sysroot=$(tail -1 <<<"$sysroot")
  # A venv of that Python, as `python3.11 -m venv` makes one (its site-packages: where the wheel is
  # laid out already).
  ln -s "$sysroot/usr/bin/python3.11" "$prefix/bin/python"
  printf 'home = %s\ninclude-system-site-packages = false\nversion = 3.11\n' "$sysroot/usr/bin" >"$prefix/pyvenv.cfg"
  mkdir -p "$work/aarch64-job" && cd "$work/aarch64-job"
  runa() { env -i HOME="$HOME" PATH="$prefix/bin:/usr/bin:/bin" TMPDIR="${TMPDIR:-/tmp}" LANG=C.UTF-8 QEMU_LD_PREFIX="$sysroot" "$@"; }
  # PATH without the venv's bin: the launcher found by the RECORD entry pip would have written.
  out=$(runa PATH=/usr/bin:/bin "$prefix/bin/python" -c '
import platform, sys, lspawn, lspawn._paths as p
print(platform.machine(), sys.version.split()[0], sys.prefix, lspawn.__file__, p.lspawn_binary(), p.guardian_binary())' 2>&1) ||
    fail "import lspawn in the aarch64 Python: $out"
  [[ $out == "aarch64 3.11."*" $prefix $prefix/lib/python3.11/site-packages/lspawn/__init__.py $prefix/bin/lspawn $prefix/lib/python3.11/site-packages/lspawn/libexec/lspawn-guardian" ]] ||
    fail "import lspawn in the aarch64 Python: '$out'"
  ok "import lspawn in Debian's arm64 Python $(cut -d' ' -f2 <<<"$out") under qemu: the wheel's package, its launcher (by RECORD) and guardian"
  out=$(runa PATH=/usr/bin:/bin "$prefix/bin/python" -m lspawn --version 2>&1) || fail "python -m lspawn --version: $out"
  [[ $out == "lspawn "* ]] || fail "python -m lspawn --version: '$out'"
  ok "python -m lspawn --version: $out"
  cat >spawn_job.py <<'EOF'
import os, platform, sys
import lspawn

def square(i, base):
    return (i, base + i * i, platform.machine(), os.getpid())

def fail_one(i):
    if i == 1:
        sys.exit(3)

if __name__ == "__main__":
    for method in sys.argv[1:]:
        got = lspawn.spawn(square, args=(10,), nprocs=2, start_method=method)
        assert [g[:3] for g in got] == [(0, 10, "aarch64"), (1, 11, "aarch64")], got
        assert len({g[3] for g in got} | {os.getpid()}) == 3, got
        try:
            lspawn.spawn(fail_one, nprocs=2, start_method=method)
        except lspawn.ProcessExitedException as e:
            assert (e.error_index, e.exit_code) == (1, 3), (e.error_index, e.exit_code)
        else:
            raise AssertionError("spawn of a process that exits 3 did not raise")
        print("spawn ok: start_method=%s returned %s; exit 3 raised ProcessExitedException(error_index=1, exit_code=3)"
              % (method, [g[:3] for g in got]), flush=True)
EOF
  out=$(runa timeout 120 python spawn_job.py spawn fork 2>&1) || fail "lspawn.spawn in the aarch64 Python: $out"
  [[ $(grep -c "^spawn ok: start_method=" <<<"$out") == 2 ]] || fail "lspawn.spawn in the aarch64 Python: $out"
  ok "lspawn.spawn(fn, nprocs=2), start methods spawn and fork, under qemu: [(0, 10, 'aarch64'), (1, 11, 'aarch64')] returned, a process's exit 3 as ProcessExitedException(error_index=1, exit_code=3)"
  # forkserver: the processes forked from a `lspawn --preload` server, past qemu's thread.
  out=$(runa LSPAWN_PRELOAD_ALLOW_THREADS=1 timeout 120 python spawn_job.py forkserver 2>&1) ||
    fail "lspawn.spawn(start_method='forkserver') in the aarch64 Python: $out"
  grep -q "^spawn ok: start_method=forkserver" <<<"$out" || fail "lspawn.spawn(start_method='forkserver') in the aarch64 Python: $out"
  ok "lspawn.spawn(start_method='forkserver') under qemu, the same (LSPAWN_PRELOAD_ALLOW_THREADS=1: qemu's thread)"
  cat >preload_job.py <<'EOF'
import os, platform, sys
with open("/proc/%d/cmdline" % os.getppid(), "rb") as f:
    parent = [os.path.basename(a) for a in f.read().decode().split("\0") if a]
print("rank %s of %s: %s, json preloaded: %s, parent: %s" % (
    os.environ["RANK"], os.environ["WORLD_SIZE"], platform.machine(), "json" in sys.modules, " ".join(parent)), flush=True)
EOF
  # The server's thread check, under qemu: it sees qemu's thread, and refuses to fork.
  set +e
  out=$(runa timeout 60 lspawn --preload json --nprocs 2 python preload_job.py 2>&1)
  rc=$?
  set -e
  if ((rc != 0)); then
    grep -q "refused: importing 'json' started 1 thread" <<<"$out" || fail "lspawn --preload json under qemu: exit $rc: $out"
    ok "lspawn --preload json under qemu: the server sees qemu's own thread and refuses to fork (exit $rc): $(grep -o "refused: importing 'json' started 1 thread ([^)]*)" <<<"$out")"
  fi
  out=$(runa LSPAWN_PRELOAD_ALLOW_THREADS=1 timeout 60 lspawn --preload json --nprocs 2 python preload_job.py 2>&1) ||
    fail "lspawn --preload json under qemu: $out"
  [[ $(grep -c "rank [01] of 2: aarch64, json preloaded: True, parent: qemu-aarch64 python lspawn_preload.py " <<<"$out") == 2 ]] ||
    fail "lspawn --preload json under qemu: $out"
  ok "LSPAWN_PRELOAD_ALLOW_THREADS=1 lspawn --preload json --nprocs 2 python under qemu: both ranks forked by the wheel's lspawn_preload.py server, json imported there"
  echo "cross wheel test: the aarch64 wheel's Python side took $((SECONDS - start)) s"
  cd "$root"
}

for part in "${parts[@]}"; do
  case $part in
    x86_64) test_x86_64 ;;
    aarch64) test_aarch64 ;;
    *) fail "unknown part '$part' (expected x86_64 or aarch64)" ;;
  esac
done
echo "cross wheel test: passed (${parts[*]}, glibc $glibc) in $SECONDS s"
