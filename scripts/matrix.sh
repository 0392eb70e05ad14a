#!/usr/bin/env bash
# Builds torchmem against one (torch, Python) pair in a virtual environment
# of its own and runs the Python suite there: CPU tensors, and CUDA tensors
# on the simulated device built for the CUDA major version that torch was
# built with. Never touches the machine-wide install or the checkout's own
# in-place build.
#
#   bash scripts/matrix.sh TORCH_VERSION PYTHON_VERSION [pytest args...]
#   bash scripts/matrix.sh 2.9.1 3.10                    # the whole Python suite
#   bash scripts/matrix.sh 2.15.0 3.13 -x tests/python/test_leak_check.py
#   bash scripts/matrix.sh 2.15.0 3.11 --smoke           # build + a short smoke suite
#
# Environment:
#   TORCHMEM_MATRIX_DIR  where everything goes (default: build/matrix in the checkout)
#   MAX_JOBS             build parallelism (default 2)
#   MATRIX_KEEP_VENV=0   delete the cell's environment after a passing run
#   MATRIX_KEEP_SHARED=0 after a passing run, also delete what other cells would
#                        reuse: the torch wheel and the pieces of its CUDA major
#                        (NVIDIA set, CUPTI, CUDA 12 toolkit, simulated device built
#                        here): the run leaves nothing behind (scripts/test.sh: CI
#                        machines have too little disk to keep two CUDA majors)
#   TORCHMEM_SIMCUDA_DIR a built simulated device to use when its libcudart.so.N is
#                        the CUDA major version of the torch tested (else one is built);
#                        build it from this checkout's tests/simcuda: an older build lacks
#                        what newer tests use (IPC tests then wait out their timeouts)
#
# Layout under TORCHMEM_MATRIX_DIR (each piece made once, then reused):
#   wheels/               torch wheels, one per (version, Python), from the package index
#   nvidia-cu12/, -cu13/  ONE set of NVIDIA libraries per CUDA major version, shared by
#                         every environment through a symlink (see below)
#   cuda12-toolkit/       CUDA 12 headers + libcudart.so.12 from NVIDIA's wheels (torch
#                         cu12 builds compile against them; CUDA 13 uses the system toolkit)
#   cupti-cuN-V/          CUPTI as torch's pin V gives it, where that differs from the
#                         set's (torch 2.11-2.14 pin CUDA 13.0's; see "CUPTI" below)
#   simcuda-cu12/, -cu13/ the simulated device as libcudart.so.12 / .13 (tests/simcuda)
#   cells/py3.X-torchV/   venv/ (the interpreter from pyenv), src/ (a copy of the
#                         checkout: tracked and untracked-not-ignored files), build/
#                         (CMake), log.txt
#
# Why the NVIDIA libraries are shared: torch's CUDA wheels pull ~3 GB of them
# (cuBLAS, cuDNN, NCCL, ...), which libtorch_cuda.so loads at import through
# its rpath ($ORIGIN/../../nvidia/...). Nothing on the simulated device runs
# them, but import needs them. Each environment installs torch with --no-deps,
# its pure-Python requirements normally (triton, needed only by
# torch.compile, is left out: ~0.9 GB and never imported by the suite), and
# gets site-packages/nvidia as a symlink to the set of its CUDA major. Each
# set holds, for every library any supported torch of that major loads, the
# newest version any of them pins: NVIDIA's libraries are backward
# compatible within a major version, so a torch built against 13.0 runs on
# 13.2's. The sets are listed below (from each torch wheel's Requires-Dist).
# The body is one compound command, read whole before it runs: editing the
# script while a cell runs cannot change what that run executes.
{
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MATRIX_DIR=${TORCHMEM_MATRIX_DIR:-$ROOT/build/matrix}
JOBS=${MAX_JOBS:-2}
log() { printf '\n==> [%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { echo "matrix.sh: $*" >&2; exit 2; }

# torch 2.9.1 and 2.10.0 (CUDA 12.8); nvshmem from 2.10.0 (2.9.1 pins 3.3.20).
NVIDIA_CU12=(nvidia-cuda-nvrtc-cu12==12.8.93 nvidia-cuda-runtime-cu12==12.8.90
  nvidia-cuda-cupti-cu12==12.8.90 nvidia-cudnn-cu12==9.10.2.21 nvidia-cublas-cu12==12.8.4.1
  nvidia-cufft-cu12==11.3.3.83 nvidia-curand-cu12==10.3.9.90 nvidia-cusolver-cu12==11.7.3.90
  nvidia-cusparse-cu12==12.5.8.93 nvidia-cusparselt-cu12==0.7.1 nvidia-nccl-cu12==2.27.5
  nvidia-nvshmem-cu12==3.4.5 nvidia-nvtx-cu12==12.8.90 nvidia-nvjitlink-cu12==12.8.93
  nvidia-cufile-cu12==1.13.1.3)
# torch 2.11.0 to 2.15.0 (CUDA 13): the toolkit libraries of 2.15.0 (13.2.2)
# plus cuRAND, which 2.11-2.14 load and 2.15 does not; cuDNN, NCCL, nvshmem
# as 2.15.0 pins them.
NVIDIA_CU13=("cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.2.2"
  nvidia-cudnn-cu13==9.26.0.51 nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7
  nvidia-nvshmem-cu13==3.7.2)
# CUDA 12.8 headers and runtime for compiling against torch's cu12 builds
# (crt/ headers come with nvcc's wheel, which has no nvcc).
CUDA12_TOOLKIT=(nvidia-cuda-runtime-cu12==12.8.90 nvidia-cuda-nvcc-cu12==12.8.93
  nvidia-cuda-profiler-api-cu12==12.8.90)

# pip without this machine's local find-links (it holds a +cpu torch that
# pip would prefer for 2.13.0); PyPI as usual, but no pip cache: every
# download is kept where it is used (wheels/, the shared sets), and a cached
# copy of the ~4 GB of NVIDIA wheels per CUDA major is what filled a CI
# machine's disk.
index_pip() { env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 "$@"; }
# pip's complaints that torch's NVIDIA and triton requirements are not in the
# environment: by design here (see above).
quiet_pip() {
  grep -v -E "dependency resolver does not|requires (nvidia-|cuda-toolkit|triton)|Running pip as the 'root'" || true
}

[[ $# -ge 2 ]] || die "usage: matrix.sh TORCH_VERSION PYTHON_VERSION [--smoke] [pytest args...]"
TORCH=$1 PY=$2
shift 2
SMOKE=0
if [[ "${1:-}" == "--smoke" ]]; then SMOKE=1; shift; fi
[[ $PY =~ ^3\.[0-9]+$ ]] || die "PYTHON_VERSION is a minor version such as 3.12, not '$PY'"
[[ $TORCH =~ ^2\.[0-9]+\.[0-9]+$ ]] || die "TORCH_VERSION is a release such as 2.15.0, not '$TORCH'"

find_python() {
  local candidate
  candidate=$(ls -d "$HOME"/.pyenv/versions/"$PY".*/bin/python"$PY" 2>/dev/null | sort -V | tail -1 || true)
  [[ -n $candidate ]] || candidate=$(command -v "python$PY" || true)
  [[ -n $candidate ]] || die "no Python $PY: install it with pyenv (pyenv install $PY) or put python$PY on PATH"
  echo "$candidate"
}
BASE_PYTHON=$(find_python)
CELL=$MATRIX_DIR/cells/py$PY-torch$TORCH
VENV=$CELL/venv
mkdir -p "$MATRIX_DIR/wheels" "$CELL"
exec > >(tee "$CELL/log.txt") 2>&1
start=$SECONDS
log "torch $TORCH on Python $PY ($BASE_PYTHON) in $CELL"

# --- torch --------------------------------------------------------------------
tag=cp${PY/./}
wheel=$(ls "$MATRIX_DIR"/wheels/torch-"$TORCH"-*"$tag-$tag"-manylinux*_x86_64.whl 2>/dev/null | head -1 || true)
if [[ -z $wheel ]]; then
  log "downloading torch $TORCH for Python $PY"
  if ! index_pip "$BASE_PYTHON" -m pip download -q --no-deps --only-binary=:all: \
      -d "$MATRIX_DIR/wheels" "torch==$TORCH"; then
    echo "RESULT: torch $TORCH has no wheel for Python $PY (unsupported by torch itself)"
    exit 3
  fi
  wheel=$(ls "$MATRIX_DIR"/wheels/torch-"$TORCH"-*"$tag-$tag"-manylinux*_x86_64.whl | head -1)
fi
# Requires-Dist of the wheel: NVIDIA packages, and everything else.
read_requirements() {
  "$BASE_PYTHON" -c '
import sys, zipfile
from email.parser import Parser
wheel, kind = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:
    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(archive.read(name).decode())
for req in metadata.get_all("Requires-Dist") or []:
    spec, _, marker = req.partition(";")
    if "extra ==" in marker:
        continue
    name = spec.strip().split("[")[0].split("=")[0].split("<")[0].split(">")[0].split("~")[0].strip()
    nvidia = name.startswith("nvidia-") or name == "cuda-toolkit"
    if (kind == "nvidia") == nvidia and name != "triton":
        print(req.strip())
' "$wheel" "$1"
}
mapfile -t torch_nvidia < <(read_requirements nvidia)
mapfile -t torch_other < <(read_requirements other)
if printf '%s\n' "${torch_nvidia[@]}" | grep -q -- '-cu12'; then CUDA_MAJOR=12
elif (( ${#torch_nvidia[@]} )); then CUDA_MAJOR=13
else die "torch $TORCH for Python $PY is not a CUDA build (no NVIDIA requirements)"; fi

# --- the shared NVIDIA set of that CUDA major --------------------------------------
NVIDIA_DIR=$MATRIX_DIR/nvidia-cu$CUDA_MAJOR
if [[ ! -f $NVIDIA_DIR/.complete ]]; then
  log "installing the shared NVIDIA libraries for CUDA $CUDA_MAJOR into $NVIDIA_DIR (once)"
  rm -rf "$NVIDIA_DIR"
  set_name=NVIDIA_CU$CUDA_MAJOR[@]
  index_pip "$BASE_PYTHON" -m pip install -q --target "$NVIDIA_DIR" --only-binary=:all: "${!set_name}" 2>&1 |
    grep -v "Running pip as the 'root' user" || true
  touch "$NVIDIA_DIR/.complete"
fi

# --- the environment -------------------------------------------------------------
if [[ ! -f $VENV/.complete ]]; then
  log "creating $VENV"
  rm -rf "$VENV"
  "$BASE_PYTHON" -m venv "$VENV"
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  ln -sfn "$NVIDIA_DIR/nvidia" "$site/nvidia"
  index_pip "$VENV/bin/python" -m pip install -q --upgrade pip
  index_pip "$VENV/bin/python" -m pip install -q --no-deps "$wheel"
  index_pip "$VENV/bin/python" -m pip install -q "${torch_other[@]}" 2>&1 | quiet_pip
  touch "$VENV/.complete"
fi
# The test requirements, torch excepted (installed above); again whenever
# requirements.txt changes.
grep -v -E '^\s*(#|$|torch==)' "$ROOT/requirements.txt" > "$CELL/requirements.txt"
# Without --no-deps, pip would also install torch's NVIDIA pins (torchmetrics
# requires torch, and pip completes an installed requirement's dependencies):
# through the site-packages/nvidia symlink that would overwrite the shared set
# with this torch's versions. A requirement's dependency may itself require
# torch (lightning -> pytorch-lightning -> torch), so every level goes in with
# --no-deps: the requirements, then, until nothing is missing, whatever the
# installed ones require and the environment lacks, torch excepted.
if ! cmp -s "$CELL/requirements.txt" "$VENV/.requirements"; then
  index_pip "$VENV/bin/python" -m pip install -q --no-deps -r "$CELL/requirements.txt" 2>&1 | quiet_pip
  for _level in 1 2 3 4 5 6 7 8; do
    "$VENV/bin/python" - "$CELL/requirements.txt" > "$CELL/requirements-deps.txt" <<'PY'
import importlib.metadata as metadata
import sys
from pip._vendor.packaging.requirements import Requirement

def installed(requirement):
    try:
        version = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        return False
    return not requirement.specifier or requirement.specifier.contains(version, prereleases=True)

def wanted(requirement, extras=()):
    marker = requirement.marker
    return marker is None or any(marker.evaluate({"extra": extra}) for extra in (*extras, ""))

missing, seen = set(), set()
todo = []
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        todo.append(Requirement(line))
while todo:
    requirement = todo.pop()
    if requirement.name.lower() == "torch" or not wanted(requirement):
        continue
    if not installed(requirement):
        missing.add(str(requirement).split(";")[0])
        continue
    key = (requirement.name.lower(), tuple(sorted(requirement.extras)))
    if key in seen:
        continue
    seen.add(key)
    for dependency in metadata.requires(requirement.name) or []:
        dep = Requirement(dependency)
        if wanted(dep, requirement.extras):
            todo.append(dep)
print("\n".join(sorted(missing)))
PY
    [[ -s $CELL/requirements-deps.txt ]] || break
    index_pip "$VENV/bin/python" -m pip install -q --no-deps -r "$CELL/requirements-deps.txt" 2>&1 | quiet_pip
  done
  if ls -d "$VENV"/lib/python*/site-packages/nvidia_* > /dev/null 2>&1; then
    die "pip installed NVIDIA packages into $VENV (through the shared set): a requirement depends on torch"
  fi
  cp "$CELL/requirements.txt" "$VENV/.requirements"
fi
# --- CUPTI: the version this torch pins ---------------------------------------------
# The one exception to the shared set: CUPTI, which kineto (torch.profiler) loads
# at startup, gets the version the torch wheel pins. Its newer releases are meant
# to work with older clients on a real driver, but on the simulated device CUPTI
# 13.2 (the set's, for torch 2.15) recurses until the stack overflows when
# cuGetExportTable fails, and kineto of torch 2.12 subscribes to CUPTI when the
# profiler first starts (2.14's does not); with the CUPTI 13.0 that 2.12 pins, the
# failure is reported and the profiler records CPU events and memory as it would
# on a GPU machine.
# The environment's site-packages/nvidia is then a tree of links to the shared
# set, with CUPTI's files linked from a CUPTI of that version (installed once).
cupti_pin() {  # the CUPTI requirement in a list of requirements, as pip takes it
  local req
  for req in "$@"; do
    req=${req%%;*} req=${req// /}
    case $req in
      nvidia-cuda-cupti-cu12==*) echo "$req"; return ;;
      cuda-toolkit\[*cupti*\]==*) echo "cuda-toolkit[cupti]==${req##*==}"; return ;;
    esac
  done
}
set_name=NVIDIA_CU$CUDA_MAJOR[@]
set_cupti=$(cupti_pin "${!set_name}")
torch_cupti=$(cupti_pin "${torch_nvidia[@]}")
site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
CUPTI_DIR=""
if [[ -n $torch_cupti && $torch_cupti != "$set_cupti" ]]; then
  CUPTI_DIR=$MATRIX_DIR/cupti-cu$CUDA_MAJOR-${torch_cupti##*==}
  if [[ ! -f $CUPTI_DIR/.complete ]]; then
    log "installing $torch_cupti into $CUPTI_DIR (once)"
    rm -rf "$CUPTI_DIR"
    index_pip "$BASE_PYTHON" -m pip install -q --target "$CUPTI_DIR" --only-binary=:all: "$torch_cupti" 2>&1 |
      grep -v "Running pip as the 'root' user" || true
    touch "$CUPTI_DIR/.complete"
  fi
  # overlay SHARED CUPTI TARGET: TARGET holds a link to each entry of SHARED, or
  # to CUPTI's entry of the same name; a directory both have is merged.
  overlay() {
    local shared=$1 cupti=$2 target=$3 entry name
    mkdir -p "$target"
    for entry in "$shared"/* "$cupti"/*; do
      [[ -e $entry ]] || continue
      name=${entry##*/}
      [[ -e $target/$name || -L $target/$name ]] && continue
      if [[ -d $shared/$name && ! -L $shared/$name && -d $cupti/$name ]]; then
        overlay "$shared/$name" "$cupti/$name" "$target/$name"
      elif [[ -e $cupti/$name ]]; then
        ln -s "$cupti/$name" "$target/$name"
      else
        ln -s "$shared/$name" "$target/$name"
      fi
    done
  }
  if [[ "$(cat "$VENV/.cupti" 2>/dev/null)" != "$torch_cupti" ]]; then
    log "site-packages/nvidia: the shared set, with $torch_cupti"
    rm -rf "${site:?}/nvidia"
    overlay "$NVIDIA_DIR/nvidia" "$CUPTI_DIR/nvidia" "$site/nvidia"
    echo "$torch_cupti" > "$VENV/.cupti"
  fi
elif [[ ! -L $site/nvidia ]]; then
  rm -rf "${site:?}/nvidia" "$VENV/.cupti"
  ln -sfn "$NVIDIA_DIR/nvidia" "$site/nvidia"
fi
PYTHON=$VENV/bin/python
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)" ||
  die "torch $TORCH does not import in $VENV"

# --- CUDA toolkit for the build ----------------------------------------------------
CUDA_ARGS=()
TOOLKIT="" SIMCUDA_BUILD=""
if [[ $CUDA_MAJOR == 12 ]]; then
  TOOLKIT=$MATRIX_DIR/cuda12-toolkit
  if [[ ! -f $TOOLKIT/.complete ]]; then
    log "assembling CUDA 12 headers and runtime from NVIDIA's wheels into $TOOLKIT (once)"
    rm -rf "$TOOLKIT"
    index_pip "$BASE_PYTHON" -m pip install -q --target "$TOOLKIT/wheels" --no-deps \
      "${CUDA12_TOOLKIT[@]}" 2>&1 | quiet_pip
    mkdir -p "$TOOLKIT/include" "$TOOLKIT/lib64"
    cp -r "$TOOLKIT"/wheels/nvidia/cuda_runtime/include/. "$TOOLKIT/include/"
    cp -r "$TOOLKIT"/wheels/nvidia/cuda_nvcc/include/. "$TOOLKIT/include/"
    cp -r "$TOOLKIT"/wheels/nvidia/cuda_profiler_api/include/. "$TOOLKIT/include/"
    ln -sf "$TOOLKIT/wheels/nvidia/cuda_runtime/lib/libcudart.so.12" "$TOOLKIT/lib64/libcudart.so.12"
    ln -sf libcudart.so.12 "$TOOLKIT/lib64/libcudart.so"
    # No nvcc in the wheels: FindCUDAToolkit reads the version from version.txt.
    echo "CUDA Version ${CUDA12_TOOLKIT[0]##*==}" > "$TOOLKIT/version.txt"
    touch "$TOOLKIT/.complete"
  fi
  CUDA_ARGS+=("-DCUDAToolkit_ROOT=$TOOLKIT")
elif [[ ! -f /usr/local/cuda/include/cuda_runtime_api.h && -z "${CUDAToolkit_ROOT:-}" ]]; then
  die "CUDA 13 toolkit not found: install it in /usr/local/cuda or set CUDAToolkit_ROOT"
elif [[ -n "${CUDAToolkit_ROOT:-}" ]]; then
  CUDA_ARGS+=("-DCUDAToolkit_ROOT=$CUDAToolkit_ROOT")
fi
export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER:-$(command -v ccache || true)}
export CMAKE_C_COMPILER_LAUNCHER=${CMAKE_C_COMPILER_LAUNCHER:-$CMAKE_CXX_COMPILER_LAUNCHER}

# --- the simulated device of that CUDA major -------------------------------------
# A build given in TORCHMEM_SIMCUDA_DIR is used if it is of this major version
# (scripts/test.sh passes build/release's, which is CUDA 13).
if [[ -f "${TORCHMEM_SIMCUDA_DIR:-/nonexistent}/libcudart.so.$CUDA_MAJOR" ]]; then
  log "simulated device (libcudart.so.$CUDA_MAJOR): $TORCHMEM_SIMCUDA_DIR"
else
  SIMCUDA_BUILD=$MATRIX_DIR/simcuda-cu$CUDA_MAJOR
  log "simulated device (libcudart.so.$CUDA_MAJOR) in $SIMCUDA_BUILD"
  cmake -S "$ROOT/tests/simcuda" -B "$SIMCUDA_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    "-DPython3_EXECUTABLE=$BASE_PYTHON" "${CUDA_ARGS[@]}" > /dev/null
  cmake --build "$SIMCUDA_BUILD" -j "$JOBS" --target simcudart simcuda_driver | tail -1
  export TORCHMEM_SIMCUDA_DIR=$SIMCUDA_BUILD/simcuda
fi
[[ -f $TORCHMEM_SIMCUDA_DIR/libcudart.so.$CUDA_MAJOR ]] ||
  die "the simulated device did not build libcudart.so.$CUDA_MAJOR"

# --- torchmem, from a copy of the checkout ----------------------------------------
log "copying the checkout to $CELL/src and building torchmem._C against torch $TORCH"
# A fresh copy: files of an earlier copy that the checkout no longer has (another branch's
# tests, sources CMake would glob) must not be built or run. Every file gets the time of
# the copy (tar -m), so everything is recompiled (through ccache when present: unchanged
# sources cost a cache hit): a cell is shared by checkouts of different branches, and a
# source older than the object built from another checkout's version of it would not be
# recompiled (the build compares times), linking a mix of both trees (seen: ODR violations
# at the link and another branch's statistics keys in the CUDA suite).
rm -rf "$CELL/src"
mkdir -p "$CELL/src"
(cd "$ROOT" && git ls-files -co --exclude-standard -z |
  tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xmf - -C "$CELL/src"
(cd "$CELL/src" && TORCHMEM_BUILD_DIR=$CELL/build MAX_JOBS=$JOBS \
  TORCHMEM_CMAKE_ARGS="${CUDA_ARGS[*]:-}" "$PYTHON" setup.py -q build_ext --inplace 2>&1 |
  grep -v -E "^(running|copying|/.*Warning|  warnings.warn|!!|\*\*\*|$)" || true)
"$PYTHON" -c "import sys; sys.path.insert(0, '$CELL/src'); import torchmem, torch; print('torchmem imports with torch', torch.__version__)"

# --- the Python suite ---------------------------------------------------------------
cd "$CELL/src"
export PYTHONPATH=$CELL/src
if (( SMOKE )); then
  log "smoke suite"
  set -- tests/python/test_leak_check.py tests/python/test_cuda_simulated.py \
    tests/python/test_stack_capture.py "$@"
fi
log "pytest ${*:-tests/python}"
status=0
"$PYTHON" -m pytest -q -p no:cacheprovider "${@:-tests/python}" || status=$?
if (( status == 0 )); then
  echo "RESULT: PASS torch $TORCH Python $PY (CUDA $CUDA_MAJOR) in $((SECONDS - start)) s"
  [[ ${MATRIX_KEEP_VENV:-1} == 0 ]] && rm -rf "$VENV" "$CELL/build"
  if [[ ${MATRIX_KEEP_SHARED:-1} == 0 ]]; then
    cd "$MATRIX_DIR"
    rm -rf "$CELL" "$wheel" "$NVIDIA_DIR" ${CUPTI_DIR:+"$CUPTI_DIR"} ${TOOLKIT:+"$TOOLKIT"} \
      ${SIMCUDA_BUILD:+"$SIMCUDA_BUILD"}
    echo "deleted the cell, its torch wheel and the CUDA $CUDA_MAJOR pieces (MATRIX_KEEP_SHARED=0)"
  fi
else
  echo "RESULT: FAIL torch $TORCH Python $PY (CUDA $CUDA_MAJOR): pytest exit $status"
fi
exit $status
}
