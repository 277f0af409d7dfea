#!/usr/bin/env bash
# Installs PyPI's LibTorch 2.x (the newest line lspawn builds against) into a virtual environment,
# idempotently, and prints the venv's path. Used by scripts/test.sh and for building by hand:
#   venv=$(bash scripts/setup-torch2.sh)
#   bash scripts/build.sh build-torch2 -DCMAKE_PREFIX_PATH="$venv/torch/share/cmake" -DLSPAWN_WITH_NCCL=ON
#
# What is downloaded, and why so little: the torch wheel alone (--no-deps, ~540 MB) carries the
# C++ LibTorch (headers, CMake config, libtorch_cpu/c10/torch_cuda). CUDA's libraries come from
# the machine's CUDA toolkit (/usr/local/cuda: cuBLAS, cuDNN, cuFFT, NVRTC, …), not from PyPI's
# nvidia-* wheels (~4 GB with every dependency); only what the toolkit lacks and libtorch_cuda.so
# needs to load is fetched: libcufile, libcusparseLt, libnvshmem_host, and the NCCL that torch was
# built against (the toolkit's NCCL, older, is what lspawn compiles against). Python's pure
# dependencies (sympy, jinja2, …) are installed too, for the interop tests (torchrun, scripts).
#
# Lightning (for the Python jobs of bench/launch/python_jobs.py and the Lightning interop checks)
# goes in with --no-deps as well, with its pure dependencies named here: its own requirements
# would let pip replace torch or pull nvidia wheels. Not installed: pytorch-lightning (the same
# code under the old name; `import lightning` does not need it) and fsspec's [http] extra
# (aiohttp, for remote checkpoints). Its own stamp, so a venv made before it only gains it.
#
# Another CUDA release of the range, built with NCCL exactly as a GPU machine with that torch has
# it (e.g. 2.11.0+cu130, the first GPU run's), goes in a venv of its own:
#   venv=$(LSPAWN_TORCH2_VERSION=2.11.0 bash scripts/setup-torch2.sh)    # <repo>/.deps/torch-2.11.0
# The CUDA runtime wheels are those the torch wheel itself pins (its Requires-Dist), read after
# it is installed, so each release gets the NCCL it was built with.
#
# Environment: LSPAWN_TORCH2_VENV (default: <repo>/.deps/torch2 for 2.15.0, else
# <repo>/.deps/torch-<version>), LSPAWN_TORCH2_VERSION (2.15.0), PYTHON (default: python3),
# LSPAWN_LIGHTNING_VERSION (2.6.6).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=${LSPAWN_TORCH2_VERSION:-2.15.0}
if [[ $version == 2.15.0 ]]; then
  venv=${LSPAWN_TORCH2_VENV:-$root/.deps/torch2}
else
  venv=${LSPAWN_TORCH2_VENV:-$root/.deps/torch-$version}
  # scripts/setup-torch-cpu.sh's folder of that release (CI's 2.4.1, C++ only) is not a venv
  [[ -z ${LSPAWN_TORCH2_VENV:-} && -e $venv/.lspawn-torch-cpu-$version ]] && venv=$root/.deps/torch-$version-venv
fi
py=${PYTHON:-python3}
pure=(filelock "typing-extensions>=4.13.0" sympy networkx jinja2 fsspec numpy)
lightning_version=${LSPAWN_LIGHTNING_VERSION:-2.6.6}
# lightning's Requires-Dist less torch, pytorch-lightning and fsspec's [http] extra (see above).
lightning=("lightning==$lightning_version" "lightning-utilities>=0.10.0,<2" "torchmetrics>0.7.0,<3"
           "PyYAML>5.4,<8" "tqdm>=4.57.0,<6" "packaging>=23.0,<27")

# What tests/python_mp runs beside Lightning: accelerate's notebook_launcher through lspawn.install(), and
# cloudpickle (lspawn's [notebook] extra: a function of a notebook's __main__ under spawn), with
# accelerate's pure and binary dependencies, --no-deps as above (torch stays).
extras=("accelerate==1.15.0" "huggingface_hub==2.4.0" "safetensors==0.8.0" "psutil==7.2.2" "cloudpickle==3.1.3")
extras_stamp=$venv/.lspawn-extras-2

stamp=$venv/.lspawn-torch2-$version
lightning_stamp=$venv/.lspawn-lightning-$lightning_version
bytecode_stamp=$venv/.lspawn-bytecode
install_extras() {
  "$venv/bin/python" -m pip --disable-pip-version-check -q install --no-deps --no-compile "${extras[@]}" >&2
  if ! "$venv/bin/python" -c 'import accelerate, cloudpickle' >&2; then
    echo "setup-torch2: import accelerate, cloudpickle failed in $venv after the install (its error is above)" >&2
    exit 1
  fi
  "$venv/bin/python" -m compileall -q -j 0 "$("$venv/bin/python" -c 'import accelerate, os; print(os.path.dirname(accelerate.__file__))')" >/dev/null 2>&1 || true
  touch "$extras_stamp"
}
if [[ -f $stamp && -f $lightning_stamp && -f $bytecode_stamp ]]; then
  [[ -f $extras_stamp ]] || install_extras
  echo "$venv"
  exit 0
fi
log() { echo "setup-torch2: $*" >&2; }
start=$SECONDS
# Bytecode for everything installed, once, here: the packages go in with --no-compile (pip would
# compile them one at a time) and a process may not write it later (PYTHONDONTWRITEBYTECODE=1 in
# the environment, as on CI's machine). Without it every worker that imports Lightning compiles
# torch._dynamo, sympy and Lightning from source: 12.4 s of CPU per `import lightning` against 5.3 s
# with it (docs/reliability.md, "CI time"). One file of torch's is 3.12-only syntax
# (torch/testing/_internal/py312_intrinsics.py), so compileall's status is not the check: the
# packages a worker imports are.
compile_bytecode() {
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$venv/bin/python" -m compileall -q -j 0 "$site" > /dev/null 2>&1 || true
  local pkg missing=()
  for pkg in torch sympy lightning networkx; do
    compgen -G "$site/$pkg/__pycache__/__init__.*.pyc" > /dev/null || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    log "compileall left no bytecode for: ${missing[*]} (in $site)"
    exit 1
  fi
  touch "$bytecode_stamp"
}
if [[ -f $stamp && -f $lightning_stamp ]]; then  # a venv from before the bytecode step
  [[ -f $extras_stamp ]] || install_extras
  compile_bytecode
  log "bytecode compiled in $((SECONDS - start)) s"
  echo "$venv"
  exit 0
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
install_lightning() {
  log "installing lightning==$lightning_version and its pure dependencies (--no-deps: torch stays $version)"
  "${pip[@]}" install --no-deps --no-compile "${lightning[@]}" >&2
  if ! "$venv/bin/python" -c 'import lightning' >&2; then
    log "import lightning failed in $venv after the install (its error is above)"
    exit 1
  fi
  touch "$lightning_stamp"
}
if [[ -f $stamp ]]; then  # torch is there: a venv from before the Lightning step
  install_lightning
  install_extras
  compile_bytecode
  log "done in $((SECONDS - start)) s"
  echo "$venv"
  exit 0
fi
"$py" -m venv "$venv" >&2
log "installing torch==$version (no CUDA dependencies) into $venv"
"${pip[@]}" install --no-deps --no-compile "torch==$version" >&2
# The CUDA runtime wheels this torch pins (for 2.15.0: nvidia-cusparselt-cu13==0.8.1,
# nvidia-nvshmem-cu13==3.7.2, nvidia-nccl-cu13==2.30.7), and libcufile (among cuda-toolkit's
# extras in the pins; the toolkit here lacks it).
#
# A torch built for another CUDA major than the toolkit's (PyPI's 2.4-2.10: CUDA 12; the toolkit
# here: 13) cannot borrow the toolkit's libraries (libcublas.so.12 is not libcublas.so.13): it gets
# every nvidia wheel it pins, with their own dependencies (nvJitLink, which cuSPARSE needs and torch
# does not name), as `pip install torch==VERSION` gives a user (~2.5 GB more).
# scripts/check-python-range.sh runs 2.4-2.10 in such venvs.
toolkit_major=$(sed -nE 's/^#define CUDART_VERSION[[:space:]]+([0-9]+)[0-9]{3}[[:space:]]*$/\1/p' \
  "${CUDA_HOME:-/usr/local/cuda}/include/cuda_runtime_api.h" 2>/dev/null || true)
mapfile -t nvidia < <(TOOLKIT_MAJOR=$toolkit_major "$venv/bin/python" - <<'EOF'
import importlib.metadata as md, os, re
pins = []
for req in md.requires("torch") or []:
    spec, _, marker = req.partition(";")
    spec = spec.replace(" ", "")
    if "extra" not in marker and spec.startswith("nvidia-"):
        pins.append(spec)
majors = {m.group(1) for m in (re.match(r"nvidia-[a-z0-9-]+-cu(\d+)", p) for p in pins) if m}
if majors and majors != {os.environ["TOOLKIT_MAJOR"]}:
    print("all")
    print(*pins, sep="\n")
else:
    print("toolkit")
    print(*(p for p in pins if re.match(r"nvidia-(cusparselt|nvshmem|nccl)-cu\d+([=<>!~]|$)", p)), sep="\n")
EOF
)
mode=${nvidia[0]:-}  # the script's first line: "all" (another CUDA major) or "toolkit"
nvidia=("${nvidia[@]:1}")
if ((${#nvidia[@]} == 0)); then
  log "torch==$version names no nvidia wheel in its Requires-Dist: not a CUDA build?"
  exit 1
fi
if [[ $mode == all ]]; then
  log "torch==$version is built for another CUDA major than the toolkit's (${toolkit_major:-none found}): installing every CUDA wheel it pins, with their dependencies: ${nvidia[*]}"
  "${pip[@]}" install --no-compile "${nvidia[@]}" >&2
else
  nvidia+=(nvidia-cufile)
  log "installing the CUDA runtime wheels it pins: ${nvidia[*]}"
  "${pip[@]}" install --no-deps --no-compile "${nvidia[@]}" >&2
fi
"${pip[@]}" install --no-compile "${pure[@]}" >&2
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# A stable path for CMake and the tests, whatever the Python version.
ln -sfn "$site/torch" "$venv/torch"
ln -sfn "$site/nvidia" "$venv/nvidia"
touch "$stamp"
install_lightning
install_extras
compile_bytecode
log "done in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1))"
echo "$venv"
