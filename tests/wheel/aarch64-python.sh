#!/usr/bin/env bash
# An aarch64 CPython runnable here under qemu-user, for tests/wheel/cross.sh's aarch64 wheel: Debian
# bookworm's arm64 python3.11 (python3.11-minimal, libpython3.11-minimal, libpython3.11-stdlib)
# with the arm64 libraries its modules need (glibc, libffi, zlib, expat, OpenSSL, bz2, lzma, ...),
# unpacked with `dpkg -x` into a sysroot of its own. Nothing is installed into the system: apt runs
# with a private state (its own package lists, an empty dpkg status, arm64 as the one
# architecture) under the cache folder, on the system's sources (/etc/apt), so neither
# `dpkg --add-architecture` nor multiarch packages are involved.
# Idempotent: the sysroot is built once (~20 s with the network, ~9 MB of .debs; its standard
# library compiled to bytecode under qemu) into
# $LSPAWN_AARCH64_SYSROOT (default ~/.cache/lspawn-aarch64-sysroot) and kept; a later call only
# checks its stamp. A finished sysroot holds .lspawn-sysroot-ok (the packages and their versions).
# The interpreter runs as: QEMU_LD_PREFIX=<sysroot> <sysroot>/usr/bin/python3.11 (with qemu-aarch64
# registered with binfmt_misc, as cross.sh does; the aarch64 programs it execs need QEMU_LD_PREFIX
# in their environment too), or qemu-aarch64 -L <sysroot> <sysroot>/usr/bin/python3.11.
# Usage: tests/wheel/aarch64-python.sh [--sysroot]
#   prints on its last line the interpreter's command
#   (env QEMU_LD_PREFIX=<sysroot> qemu-aarch64 <sysroot>/usr/bin/python3.11), or with --sysroot
#   the sysroot's path only.
# Exit status: 0 ready; 3 the arm64 packages could not be downloaded (no network, no arm64 in the
# sources): the reason on stderr, for a caller that skips; 1 anything else.
# Needs (scripts/install-deps.sh): apt, dpkg, qemu-user (qemu-aarch64, for the check at the end).
set -euo pipefail
sysroot=${LSPAWN_AARCH64_SYSROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/lspawn-aarch64-sysroot}
py=usr/bin/python3.11
# python3.11-minimal: the interpreter, libpython3.11-minimal/-stdlib: the standard library and
# its extension modules; the rest are what those link (readelf -d): libc6, libgcc-s1 (glibc's
# pthread_cancel dlopens libgcc_s), zlib1g and libexpat1 (the interpreter), libssl3 (_ssl,
# _hashlib), libffi8 (_ctypes), libbz2-1.0, liblzma5, libuuid1, libcrypt1. Not here: readline,
# curses, sqlite3, dbm (lspawn imports none of them).
packages=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 libgcc-s1 zlib1g
  libexpat1 libssl3 libffi8 libbz2-1.0 liblzma5 libuuid1 libcrypt1)
stamp=$sysroot/.lspawn-sysroot-ok
say() { echo "aarch64-python: $*" >&2; }
print() {
  if [[ ${1:-} == --sysroot ]]; then echo "$sysroot"; else echo "env QEMU_LD_PREFIX=$sysroot qemu-aarch64 $sysroot/$py"; fi
}

if [[ -f $stamp && -x $sysroot/$py ]] && [[ $(head -1 "$stamp") == "packages: ${packages[*]}" ]]; then
  print "$@"
  exit 0
fi

command -v dpkg >/dev/null && command -v apt-get >/dev/null || { say "needs dpkg and apt-get (a Debian system)"; exit 1; }
parent=$(dirname "$sysroot")
mkdir -p "$parent"
work=$(mktemp -d "$parent/.lspawn-aarch64-sysroot.XXXXXX")
trap 'rm -rf "$work"' EXIT
state=$work/apt
mkdir -p "$state/lists/partial" "$state/archives/partial" "$work/debs" "$work/root"
: >"$state/status"
# apt with a state of its own: the system's sources and settings (/etc/apt, proxies included), arm64
# as the only architecture, an empty dpkg status (nothing "installed"), lists and archives here;
# no _apt sandbox (it cannot enter a private cache folder such as /root/.cache).
apt_opts=(-q -o APT::Sandbox::User=root -o APT::Architecture=arm64 -o APT::Architectures::=arm64
  -o Dir::State::Lists="$state/lists" -o Dir::State::status="$state/status"
  -o Dir::Cache="$state" -o Dir::Cache::Archives="$state/archives"
  -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
start=$SECONDS
if ! apt-get "${apt_opts[@]}" --error-on=any update >"$work/update.log" 2>&1; then
  say "apt-get update for arm64 failed (no network? no arm64 in /etc/apt's sources?):"
  tail -5 "$work/update.log" >&2
  exit 3
fi
if ! (cd "$work/debs" && apt-get "${apt_opts[@]}" download "${packages[@]}") >"$work/download.log" 2>&1; then
  say "apt-get download of the arm64 packages failed:"
  tail -5 "$work/download.log" >&2
  exit 3
fi
for deb in "$work"/debs/*.deb; do
  dpkg -x "$deb" "$work/root"
done
[[ -x $work/root/$py ]] || { say "no $py in the unpacked packages"; exit 1; }
{
  echo "packages: ${packages[*]}"
  for deb in "$work"/debs/*.deb; do dpkg-deb -f "$deb" Package Version Architecture | paste -sd' '; done
} >"$work/root/.lspawn-sysroot-ok.new"
# The check: the modules lspawn's Python side and its workers use, run under qemu.
command -v qemu-aarch64 >/dev/null || { say "no qemu-aarch64 (Debian: apt-get install qemu-user)"; exit 1; }
if ! out=$(QEMU_LD_PREFIX=$work/root qemu-aarch64 "$work/root/$py" -c '
import ctypes, hashlib, json, multiprocessing, pickle, platform, select, socket, ssl, subprocess, sys, zlib
print(sys.version.split()[0], platform.machine(), ctypes.CDLL(None).getpid() > 0)' 2>&1); then
  say "the unpacked python3.11 fails under qemu-aarch64: $out"
  exit 1
fi
[[ $out == "3.11."*" aarch64 True" ]] || { say "the unpacked python3.11 says '$out', expected 3.11.x aarch64 True"; exit 1; }
# Bytecode for the standard library, as Debian's postinst (py3compile) writes it: without it every
# process compiles what it imports, under qemu (`import lspawn` 3.2 s, not 0.9 s). ~10 s, once.
QEMU_LD_PREFIX=$work/root qemu-aarch64 "$work/root/$py" -m compileall -q -j0 "$work/root/usr/lib/python3.11" >"$work/compile.log" 2>&1 ||
  { say "compileall of the standard library failed:"; tail -5 "$work/compile.log" >&2; exit 1; }
mv "$work/root/.lspawn-sysroot-ok.new" "$work/root/.lspawn-sysroot-ok"
# Replaced as a whole (a stale or broken one moved aside first), never half-written; -T: a
# sysroot that a concurrent call put there first is kept, not nested into.
if [[ -e $sysroot ]]; then
  mv -T "$sysroot" "$work/old"
fi
mv -T "$work/root" "$sysroot" 2>/dev/null || [[ -f $stamp ]] || { say "cannot move the sysroot to $sysroot"; exit 1; }
say "Python $out in $sysroot ($(du -sm "$sysroot" | cut -f1) MB from $(ls "$work"/debs/*.deb | wc -l) packages of $(du -cm "$work"/debs/*.deb | tail -1 | cut -f1) MB) in $((SECONDS - start)) s"
print "$@"
