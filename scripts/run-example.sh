#!/usr/bin/env bash
# Sets up a fresh machine, builds lspawn, and runs the main job: 4 workers launched by `lspawn`
# that rendezvous through c10d's TCPStore, form a gloo process group and all-reduce.
# Usage: scripts/run-example.sh [NPROCS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh
bash scripts/build.sh "$root/build" -DLSPAWN_BUILD_TESTS=OFF >/dev/null
exec "$root/build/launcher/lspawn" --nprocs "${1:-4}" "$root/build/examples/hello_allreduce"
