#!/usr/bin/env bash
# The CMake install is relocatable (supervisor/install_layout.hpp): `cmake --install` into a
# temporary prefix, the prefix moved, and the moved bin/lspawn still finds its guardian and
# --preload's server (nothing of the build tree or of the first prefix written into the
# binaries); a removed helper is named with where it was looked for; --result-file's JSON says
# the root cause, each worker's pid, exit code and signal.
# Usage: install_moved.sh BUILD_DIR PYTHON
set -euo pipefail
build=$1 py=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/lspawn-install-moved.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "install_moved: FAILED: $*" >&2; exit 1; }
# --strip: debug info names the sources and the build folder (for debuggers); what is checked below
# is that no path the program uses is written into it.
cmake --install "$build" --prefix "$work/first" --strip >/dev/null
mv "$work/first" "$work/moved"
bin=$work/moved/bin/lspawn
if strings "$bin" "$work/moved/libexec/lspawn/lspawn-guardian" | grep -F -e "$build" -e "$work/first"; then
  fail "the installed binaries name the build tree or the first prefix (above)"
fi
cd "$work"
# The program of this worker's lspawn's guardian (the process whose parent is the worker's parent,
# lspawn): other lspawns may run beside this test (ctest -j), each with its guardian.
own_guardian='for p in /proc/[0-9]*; do [ "$(awk "/^PPid:/{print \$2}" "$p/status" 2>/dev/null)" = "$PPID" ] && readlink "$p/exe"; done | grep lspawn-guardian'
# The guardian running beside the workers is the moved prefix's.
out=$("$bin" --nprocs 1 --quiet --no-prefix sh -c "$own_guardian")
[[ $out == "$work/moved/libexec/lspawn/lspawn-guardian" ]] || fail "guardian: expected the moved prefix's, got '$out'"
# --preload from the moved prefix.
printf 'import os\nprint("preloaded worker", os.environ["RANK"], flush=True)\n' >job.py
out=$("$bin" --nprocs 2 --preload json "$py" job.py 2>&1) || fail "--preload from the moved prefix: $out"
grep -q "preloaded worker 1" <<<"$out" || fail "--preload from the moved prefix: $out"
# --result-file: rank 1 fails with 3, rank 0 is stopped by lspawn.
set +e
"$bin" --nprocs 2 --quiet --result-file "$work/result.json" sh -c '[ "$RANK" = 1 ] && exit 3; exec sleep 30' 2>/dev/null
rc=$?
set -e
((rc == 3)) || fail "--result-file run: exit $rc, expected 3"
"$py" - "$work/result.json" <<'PY' || fail "--result-file: $(cat "$work/result.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["version"] == 1 and r["exit_code"] == 3 and r["root_cause"] == 1 and r["hang"] is False, r
assert r["ranks"] == [0, 1] and r["exit_codes"][1] == 3 and r["signals"][1] == 0, r
assert r["signals"][0] == 15 and r["stopped"] == [1, 0] and all(p > 0 for p in r["pids"]), r
PY
# A removed helper: named, with where lspawn looked for it.
rm "$work/moved/share/lspawn/python/lspawn_preload.py"
set +e
out=$("$bin" --nprocs 1 --preload json "$py" job.py 2>&1)
rc=$?
set -e
((rc != 0)) || fail "--preload without its server file succeeded"
grep -qF "is missing: lspawn_preload.py (looked for $work/moved/share/lspawn/python/lspawn_preload.py" <<<"$out" ||
  fail "--preload without its server file: $out"
echo "install_moved: ok"
