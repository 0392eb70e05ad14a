#!/usr/bin/env bash
# Checks that C and C++ files follow the repository's .clang-format.
#
#   scripts/check_format.sh                 # the whole tree: csrc, tests, benchmarks
#   scripts/check_format.sh PATH...         # these files or folders instead
#   FIX=1 scripts/check_format.sh [PATH...] # rewrite the files in place
#
# Prints each file that differs (with clang-format's diagnostics) and exits 1
# if any does. Folders are searched for *.h, *.cc, *.c and *.cpp.
#
# scripts/test.sh (and so CI) runs it over the whole tree.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "${root}"

FORMATTED_PATHS=(csrc tests benchmarks)

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
