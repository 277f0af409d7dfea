#!/usr/bin/env bash
# Installs every dependency lspawn needs to build, test and benchmark, from Debian packages.
# Idempotent: packages already present are skipped by apt; safe to run on every CI start.
# Usage: scripts/install-deps.sh [--bench]   (--bench adds the reference tools: python3-torch, openmpi)
set -euo pipefail

want=(
  cmake ninja-build g++ lld pkg-config ccache
  libtorch-dev libgloo-dev catch2 nlohmann-json3-dev
  libssl-dev                            # runtime/record_auth: HMAC-SHA256 (libcrypto)
  libopenblas0-pthread
  python3-torch openmpi-bin libopenmpi-dev procps
  slurmctld slurmd slurm-client munge   # tests/cluster: a private two-node Slurm 22.05 cluster
  clang libclang-rt-14-dev              # fuzz/: libFuzzer targets (scripts/fuzz.sh)
  clang-format                          # scripts/format.sh --check: the C++ layout (.clang-format), checked first by test.sh
  iproute2 util-linux coreutils          # tests/multinode: network-namespace hosts
  openssh-server openssh-client          # tests/multinode/ssh_test.sh: a real sshd in each host (never started as a service here)
  python3-sklearn                        # examples/digits_ddp: the digits data set
  libjemalloc2                           # tests/e2e: --preload accepts jemalloc's background thread
  python3-venv binutils                  # tests/wheel: the wheel in a fresh venv; strings(1)
  python3-dev pybind11-dev               # the torch.distributed backend's shim for Debian's Python torch 1.13
  python3-cloudpickle                    # tests/python_mp: lspawn.spawn() of a notebook's function (the [notebook] extra)
  qemu-user libc6-arm64-cross llvm file  # tests/wheel/cross.sh: the aarch64 wheel under qemu, its glibc; llvm-strip (cmake/zig-toolchain.cmake);
                                         # its arm64 python3.11 (tests/wheel/aarch64-python.sh) is apt-get download + dpkg -x, nothing installed
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
