#!/usr/bin/env bash
# Runs every test: the README's second command, and what CI runs (.ci/run).
#
#   bash scripts/test.sh
#
# 1. installs/builds whatever is missing (scripts/install.sh --no-demo);
# 2. the C/C++ formatting check (clang-format, whole tree), then C++ tests
#    (GoogleTest, CTest), including the CUDA backend on the
#    simulated CUDA device, then clang-tidy over the engine and the backends;
# 3. the same C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer;
# 4. the concurrency tests under ThreadSanitizer (built with clang, which also
#    checks the thread-safety annotations);
# 5. a CI-sized fuzzing run of the engine (libFuzzer);
# 6. the Python tests (pytest), CPU tensors and CUDA tensors on the simulated device;
# 7. the oldest and newest supported torch (2.9.1 with Python 3.10, 2.15.0 with
#    Python 3.13): built in their own environments, smoke-tested (scripts/matrix.sh);
# 8. a smoke run of the benchmarks (they measure; they are not tests of speed).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
JOBS=${MAX_JOBS:-2}
log() { printf '\n==> %s\n' "$*"; }
start=$SECONDS

bash scripts/install.sh --no-demo
[[ -d build/cuda-toolkit && ! -f /usr/local/cuda/include/cuda_runtime_api.h ]] &&
  export CUDAToolkit_ROOT=$PWD/build/cuda-toolkit
CUDA_ARGS=()
[[ -n "${CUDAToolkit_ROOT:-}" ]] && CUDA_ARGS+=("-DCUDAToolkit_ROOT=$CUDAToolkit_ROOT")

log "C and C++ formatting (scripts/check_format.sh: the whole tree against .clang-format)"
bash scripts/check_format.sh

log "C++ tests (release)"
ctest --test-dir build/release --output-on-failure -j "$JOBS"

log "clang-tidy over the engine and the backends (scripts/check_tidy.sh)"
JOBS=$JOBS bash scripts/check_tidy.sh build/release

log "C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DTORCHMEM_SANITIZE=address;undefined" \
  -DTORCHMEM_BUILD_PYTHON=OFF -DTORCHMEM_BUILD_BENCHMARKS=OFF "${CUDA_ARGS[@]}" > /dev/null
cmake --build build/asan -j "$JOBS"
# The simulated CUDA runtime is preloaded ahead of the ASan runtime.
ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=1 \
  ctest --test-dir build/asan --output-on-failure -j "$JOBS"

log "concurrency tests under ThreadSanitizer (clang: also checks the lock annotations)"
cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTORCHMEM_SANITIZE=thread \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DTORCHMEM_BUILD_PYTHON=OFF -DTORCHMEM_BUILD_BENCHMARKS=OFF -DTORCHMEM_BUILD_SIMCUDA=OFF \
  -DTORCHMEM_BUILD_CUDA=OFF > /dev/null
cmake --build build/tsan -j "$JOBS" --target torchmem_concurrency_tests
TSAN_OPTIONS=halt_on_error=1 build/tsan/tests/cpp/torchmem_concurrency_tests

log "fuzzing the engine (CI-sized run; tests/fuzz/run_fuzz.sh 3600 for the long one)"
bash tests/fuzz/run_fuzz.sh "${FUZZ_SECONDS:-60}"

log "Python tests (CPU tensors, and CUDA tensors on the simulated device)"
# The uninstrumented simulated device (build/asan has an ASan-built copy).
export TORCHMEM_SIMCUDA_DIR=$PWD/build/release/simcuda
$PYTHON -m pytest tests/python -q -p no:cacheprovider

log "oldest and newest supported torch: build and smoke-test (scripts/matrix.sh --smoke)"
# torch 2.9.1 (CUDA 12, on the simulated libcudart.so.12) with Python 3.10 and
# torch 2.15.0 (CUDA 13) with Python 3.13: each in its own environment under
# build/matrix. Each needs ~9 GB of disk (8.8 GB measured) while it runs (torch, the NVIDIA
# libraries its import loads); after a passing run everything it downloaded is
# deleted (MATRIX_KEEP_SHARED=0), so the two never need the disk at once. The
# full matrix is scripts/matrix.sh TORCH PYTHON for each cell (docs/supported-versions.md).
df -h "$PWD" | tail -1 | awk '{print "disk: " $4 " free of " $2 " before the matrix smoke runs"}'
MATRIX_KEEP_VENV=0 MATRIX_KEEP_SHARED=0 bash scripts/matrix.sh 2.9.1 3.10 --smoke
MATRIX_KEEP_VENV=0 MATRIX_KEEP_SHARED=0 bash scripts/matrix.sh 2.15.0 3.13 --smoke

log "benchmark smoke run (benchmarks/run_all.py --quick; it measures, it does not test speed)"
$PYTHON benchmarks/run_all.py --quick --build-dir build/release --no-build
log "distributed benchmark smoke run (payload sizes; gather times at 2 ranks)"
$PYTHON benchmarks/distributed_gather.py --worlds 2 --repeats 1

log "all tests passed in $((SECONDS - start)) s"
