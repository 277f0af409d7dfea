#!/usr/bin/env bash
# Installs every dependency lspawn needs to build, test and benchmark, from Debian packages.
# Idempotent: packages already present are skipped by apt; safe to run on every CI start.
# Usage: scripts/install-deps.sh [--bench]   (--bench adds the reference tools: python3-torch, openmpi)
set -euo pipefail

want=(
  cmake ninja-build g++ lld pkg-config ccache
  libtorch-dev libgloo-dev libspdlog-dev catch2 libfmt-dev
  libboost1.74-dev libboost-filesystem1.74-dev
  nlohmann-json3-dev libprotobuf-dev protobuf-compiler
  libssl-dev clang libclang-rt-14-dev util-linux
  libopenblas0-pthread
  python3-torch openmpi-bin libopenmpi-dev procps
)
[[ "${1:-}" == "--bench" ]] && want+=(hyperfine python3-matplotlib)

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#want[@]} packages present"
  exit 0
fi
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
