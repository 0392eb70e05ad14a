#!/usr/bin/env bash
# Builds and runs the engine fuzzer (tests/fuzz/engine_fuzzer.cc): clang 14,
# libFuzzer, AddressSanitizer + UndefinedBehaviorSanitizer, into build/fuzz.
# Runs for <seconds> over a copy of the checked-in corpus and fails on any
# crash (a failed model check aborts, and counts as one). Prints the number
# of executions and the coverage reached.
#
#   tests/fuzz/run_fuzz.sh 120           # CI-sized run (about 2 minutes)
#   tests/fuzz/run_fuzz.sh 3600          # the longer run: one hour, e.g. before a
#                                        # release or after changing the engine
#   JOBS=2 tests/fuzz/run_fuzz.sh 3600   # the same with 2 fuzzing processes
#
# A crash leaves its input in build/fuzz/artifacts/. Reproduce it with
#   build/fuzz/tests/fuzz/torchmem_engine_fuzzer build/fuzz/artifacts/crash-<sha1>
# fix the bug, then copy the input into tests/fuzz/corpus/ as a regression.
# New inputs the run found are kept in build/fuzz/corpus/; to grow the
# checked-in corpus with the ones that add coverage:
#   build/fuzz/tests/fuzz/torchmem_engine_fuzzer -merge=1 tests/fuzz/corpus build/fuzz/corpus
set -euo pipefail

seconds="${1:?usage: tests/fuzz/run_fuzz.sh <seconds>}"
jobs="${JOBS:-1}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${root}/build/fuzz"
mkdir -p "${build}"

cmake -S "${root}" -B "${build}" -G Ninja \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DTORCHMEM_SANITIZE=address;undefined" \
  -DTORCHMEM_BUILD_FUZZERS=ON -DTORCHMEM_BUILD_TESTS=OFF -DTORCHMEM_BUILD_PYTHON=OFF \
  -DTORCHMEM_BUILD_BENCHMARKS=OFF -DTORCHMEM_BUILD_CUDA=OFF -DTORCHMEM_BUILD_SIMCUDA=OFF \
  > "${build}.configure.log" 2>&1 || { cat "${build}.configure.log"; exit 1; }
cmake --build "${build}" --target torchmem_engine_fuzzer -j "${BUILD_JOBS:-2}"

fuzzer="${build}/tests/fuzz/torchmem_engine_fuzzer"
corpus="${build}/corpus"
artifacts="${build}/artifacts"
mkdir -p "${corpus}" "${artifacts}"
cp -n "${root}"/tests/fuzz/corpus/* "${corpus}/" 2>/dev/null || true

log="${build}/fuzz.log"
status=0
cd "${build}"  # with -jobs, libFuzzer writes fuzz-<n>.log into the current directory
rm -f fuzz-*.log
parallel=()
if [[ "${jobs}" != 1 ]]; then parallel=(-jobs="${jobs}" -workers="${jobs}"); fi
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="print_stacktrace=1" \
  "${fuzzer}" "${corpus}" \
  -max_total_time="${seconds}" -max_len=4096 -timeout=30 -rss_limit_mb=4096 \
  "${parallel[@]}" -print_final_stats=1 \
  -artifact_prefix="${artifacts}/" > "${log}" 2>&1 || status=$?
cat fuzz-*.log >> "${log}" 2>/dev/null || true
rm -f fuzz-*.log

executions="$(grep -h 'stat::number_of_executed_units' "${log}" | awk '{s += $2} END {print s + 0}')"
last="$(grep -hE '^#[0-9]+.*cov:' "${log}" | tail -n 1 || true)"
echo "engine fuzzer: ${executions} executions in ${seconds} s (${jobs} job(s))"
echo "last status: ${last}"
if [[ ${status} -ne 0 ]] || grep -qE 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)|runtime error:|engine_fuzzer: check failed' "${log}"; then
  echo "engine fuzzer: CRASH (exit ${status}); see ${log} and ${artifacts}/" >&2
  grep -hE -A12 'engine_fuzzer: check failed|ERROR: |runtime error:' "${log}" | head -n 60 >&2
  exit 1
fi
echo "engine fuzzer: no crash"
