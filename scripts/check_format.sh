#!/usr/bin/env bash
# Checks that C and C++ files follow the repository's .clang-format.
#
#   scripts/check_format.sh                 # the paths in FORMATTED_PATHS below
#   scripts/check_format.sh PATH...         # these files or folders instead
#   FIX=1 scripts/check_format.sh [PATH...] # rewrite the files in place
#
# Prints each file that differs (with clang-format's diagnostics) and exits 1
# if any does. Folders are searched for *.h, *.cc, *.c and *.cpp.
#
# FORMATTED_PATHS lists the parts of the tree already formatted by the tool;
# a path joins the list once its files are formatted, until the list is the
# whole tree (csrc, tests, benchmarks) and the check runs in CI over all of it.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "${root}"

FORMATTED_PATHS=(
  csrc/torchmem/core/attribution.cc
  csrc/torchmem/core/attribution.h
  csrc/torchmem/core/backend.h
  csrc/torchmem/core/block.h
  csrc/torchmem/core/context_capture.cc
  csrc/torchmem/core/context_capture.h
  csrc/torchmem/core/device_engines.cc
  csrc/torchmem/core/device_engines.h
  csrc/torchmem/core/engine.cc
  csrc/torchmem/core/engine.h
  csrc/torchmem/core/engine_cache.cc
  csrc/torchmem/core/engine_events.cc
  csrc/torchmem/core/engine_invariants.cc
  csrc/torchmem/core/engine_pools.cc
  csrc/torchmem/core/engine_reports.cc
  csrc/torchmem/core/engine_scopes.cc
  csrc/torchmem/core/engine_settings.cc
  csrc/torchmem/core/engine_trace.cc
  csrc/torchmem/core/fork_safety.cc
  csrc/torchmem/core/fork_safety.h
  csrc/torchmem/core/format.cc
  csrc/torchmem/core/format.h
  csrc/torchmem/core/free_lists.cc
  csrc/torchmem/core/free_lists.h
  csrc/torchmem/core/mutex.cc
  csrc/torchmem/core/mutex.h
  csrc/torchmem/core/reports.h
  csrc/torchmem/core/shared_library.cc
  csrc/torchmem/core/shared_library.h
  csrc/torchmem/core/size_policy.cc
  csrc/torchmem/core/size_policy.h
  csrc/torchmem/core/stats.cc
  csrc/torchmem/core/stats.h
  csrc/torchmem/core/trace.cc
  csrc/torchmem/core/trace.h
  csrc/torchmem/core/trace_labels.cc
  csrc/torchmem/core/trace_labels.h
  csrc/torchmem/core/types.h
  csrc/torchmem/core/warnings.cc
  csrc/torchmem/core/warnings.h
  csrc/torchmem/backends/host_backend.cc
  csrc/torchmem/backends/host_backend.h
  tests/doubles
  tests/cpp/core
  tests/cpp/doubles
  tests/cpp/support
  tests/cpp/backends/host_backend_test.cc
  tests/fuzz/engine_fuzzer.cc
  benchmarks/engine_benchmark.cc
  benchmarks/trace_replay.cc
)

clang_format="${CLANG_FORMAT:-clang-format}"
if ! command -v "${clang_format}" > /dev/null; then
  echo "check_format: ${clang_format} not found (set CLANG_FORMAT or install clang-format)" >&2
  exit 2
fi

paths=("$@")
if [[ ${#paths[@]} -eq 0 ]]; then paths=("${FORMATTED_PATHS[@]}"); fi

files=()
for path in "${paths[@]}"; do
  if [[ -d "${path}" ]]; then
    while IFS= read -r -d '' file; do files+=("${file}"); done < <(
      find "${path}" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.c' -o -name '*.cpp' \) \
        -print0 | sort -z)
  elif [[ -f "${path}" ]]; then
    files+=("${path}")
  else
    echo "check_format: no such file or folder: ${path}" >&2
    exit 2
  fi
done

if [[ "${FIX:-0}" == 1 ]]; then
  "${clang_format}" -i --style=file "${files[@]}"
  echo "check_format: formatted ${#files[@]} files"
  exit 0
fi

bad=0
for file in "${files[@]}"; do
  if ! "${clang_format}" --dry-run --Werror --style=file "${file}" > /dev/null 2>&1; then
    echo "not formatted: ${file}"
    bad=$((bad + 1))
  fi
done
if [[ ${bad} -ne 0 ]]; then
  echo "check_format: ${bad} of ${#files[@]} files differ from .clang-format;" \
       "run FIX=1 scripts/check_format.sh ${*:-} to format them" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files follow .clang-format"
