#!/usr/bin/env bash
# Installs everything torchmem needs on a fresh Debian 12 machine, builds it,
# and runs the demo (the README's first command).
#
#   bash scripts/install.sh            # install, build, run `python -m torchmem demo`
#   bash scripts/install.sh --no-demo  # install and build only (used by scripts/test.sh)
#
# Idempotent: on a machine that already has everything it only rebuilds
# what changed. Needs root (or sudo) for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUN_DEMO=1
[[ "${1:-}" == "--no-demo" ]] && RUN_DEMO=0

PYTHON=${PYTHON:-python3}
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO=sudo

log() { printf '\n==> %s\n' "$*"; }

# --- system packages ----------------------------------------------------------
APT_PACKAGES=(build-essential cmake ninja-build git libgtest-dev libbenchmark-dev libabsl-dev
              clang clang-format clang-tidy libclang-rt-14-dev valgrind
              chromium)  # chromium: the HTML report's browser test (tests/python/test_html_report.py)
missing=()
for package in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if (( ${#missing[@]} )); then
  log "apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# --- Python packages ----------------------------------------------------------
log "pip install (torch 2.14.1 CUDA build, torchmetrics, test and report tools)"
# No pip cache: torch and its NVIDIA libraries are ~5 GB installed; a cached
# copy of their wheels besides would take disk the matrix smoke test needs.
$PYTHON -m pip install -q --no-cache-dir --disable-pip-version-check -r requirements.txt

# --- CUDA toolkit (headers + shared cudart) -------------------------------------
# The machine normally has the CUDA 13 toolkit in /usr/local/cuda. If not, use
# NVIDIA's wheels (torch already pulled in nvidia-cuda-runtime) through a small
# toolkit-shaped folder that CMake's FindCUDAToolkit understands.
if [[ -z "${CUDAToolkit_ROOT:-}" && ! -f /usr/local/cuda/include/cuda_runtime_api.h ]]; then
  log "no CUDA toolkit in /usr/local/cuda: assembling one from NVIDIA's wheels"
  $PYTHON -m pip install -q "nvidia-cuda-runtime==13.*" "nvidia-cuda-nvcc==13.*"
  bash scripts/cuda_toolkit_from_wheels.sh "$ROOT/build/cuda-toolkit"
fi
if [[ -d "$ROOT/build/cuda-toolkit" && -z "${CUDAToolkit_ROOT:-}" && ! -f /usr/local/cuda/include/cuda_runtime_api.h ]]; then
  export CUDAToolkit_ROOT="$ROOT/build/cuda-toolkit"
fi
CMAKE_CUDA_ARGS=()
[[ -n "${CUDAToolkit_ROOT:-}" ]] && CMAKE_CUDA_ARGS+=("-DCUDAToolkit_ROOT=$CUDAToolkit_ROOT")

# --- torchmem itself ------------------------------------------------------------
log "building torchmem (pip install -e ., CMake underneath)"
TORCHMEM_CMAKE_ARGS="${CMAKE_CUDA_ARGS[*]:-}" $PYTHON -m pip install -q --no-build-isolation \
  --disable-pip-version-check -e .

log "building the C++ tests, benchmarks and the simulated CUDA device"
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release "-DPython3_EXECUTABLE=$(command -v $PYTHON)" \
  -DTORCHMEM_BUILD_PYTHON=OFF "${CMAKE_CUDA_ARGS[@]}" > /dev/null
cmake --build build/release -j "${MAX_JOBS:-2}"

if (( RUN_DEMO )); then
  log "python -m torchmem demo"
  $PYTHON -m torchmem demo
fi
