#!/usr/bin/env bash
# Runs PyTorch's own allocator and memory-snapshot tests (from pytorch/pytorch's
# test/test_cuda.py) on the simulated CUDA device, once with PyTorch's allocator
# and once with torchmem installed, and prints a table per test.
#
#   bash scripts/run_pytorch_allocator_tests.sh DIR [extra pytest args...]
#
# DIR holds test_cuda.py from PyTorch's source tree, of a version close to the
# installed torch (the wheel ships no tests; this repository commits none).
# torchmem is installed by a sitecustomize.py in a temporary directory put first
# on PYTHONPATH, so it precedes CUDA initialization in the test process and in
# every Python subprocess the tests start. Comparing with the run under PyTorch's
# allocator separates torchmem's failures from what the simulated device cannot
# do (kernels do not run, so tests that check computed values fail under both).
# Needs torchmem and the simulated device built (`bash scripts/install.sh`, or
# an in-place build plus build/release) and the Python package `expecttest`.
#
# ALLOCATORS="torchmem" reruns one side only and compares it with the other
# side's results already in OUT (default build/pytorch-tests) from an earlier
# run of the same test file: PyTorch's side does not change with torchmem.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
DIR=${1:?usage: run_pytorch_allocator_tests.sh DIR-with-test_cuda.py [pytest args]}
shift
DIR=$(cd "$DIR" && pwd)
[[ -f $DIR/test_cuda.py ]] || { echo "no test_cuda.py in $DIR" >&2; exit 2; }

OUT=${OUT:-$ROOT/build/pytorch-tests}
mkdir -p "$OUT"
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
cat > "$SITE/sitecustomize.py" <<'PY'
import os

if os.environ.get("TORCHMEM_PYTORCH_TESTS") == "torchmem":
    import torchmem

    torchmem.install()
PY

# The simulated NVML too: PyTorch's expandable segments need it (tests/simcuda/README.md).
PRELOAD=$($PYTHON -c "import sys; sys.path.insert(0, 'tests/simcuda'); import simcuda; print(simcuda.preload(nvml=True))")
run_pytest() {  # allocator, junit file, pytest args (a test id: only that test runs)...
  local allocator=$1 junit=$2
  shift 2
  # In DIR: PyTorch's tests write files next to themselves.
  (cd "$DIR" &&
    env LD_PRELOAD="$PRELOAD" SIMCUDA_DEVICE_COUNT=2 SIMCUDA_MEMORY_BYTES=16G \
      CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" \
      TORCHMEM_PYTORCH_TESTS="$allocator" PYTHONPATH="$SITE:$ROOT" \
      timeout 900 $PYTHON -m pytest -p no:cacheprovider -q -o addopts= \
      --junitxml="$junit" "$@")
}

# One process per test: a test that breaks its process (PyTorch's allocator with
# expandable_segments on the simulated device, a failed capture) must not fail
# the tests after it.
mapfile -t TESTS < <(cd "$DIR" && env PYTHONPATH="$ROOT" $PYTHON -m pytest test_cuda.py \
  --collect-only -q -p no:cacheprovider -o addopts= "$@" 2>/dev/null | grep '::')
echo "${#TESTS[@]} tests" >&2
for allocator in ${ALLOCATORS:-native torchmem}; do
  echo "==> PyTorch's allocator tests with the $allocator allocator" >&2
  rm -rf "$OUT/$allocator" && mkdir -p "$OUT/$allocator"
  : > "$OUT/$allocator.log"
  for i in "${!TESTS[@]}"; do
    run_pytest "$allocator" "$OUT/$allocator/$i.xml" "${TESTS[$i]}" >> "$OUT/$allocator.log" 2>&1 || true
  done
done
for allocator in native torchmem; do
  [[ -d $OUT/$allocator ]] || { echo "no results of the $allocator allocator in $OUT" >&2; exit 2; }
done
$PYTHON scripts/pytorch_test_table.py "$OUT/native" "$OUT/torchmem" | tee "$OUT/table.md"
