#!/usr/bin/env bash
# Runs clang-tidy (the checks in .clang-tidy) over the layers that include no torch header:
# the engine (csrc/torchmem/core) and the backends (csrc/torchmem/backends).
#
#   scripts/check_tidy.sh [BUILD_DIR]   # BUILD_DIR holds compile_commands.json (build/release)
#
# Prints every finding and exits 1 if there is any. The torch glue and the bindings are not
# checked here: each of their files parses PyTorch's headers (tens of seconds a file), which
# would add about ten minutes to CI on two cores; run clang-tidy -p build/python FILE for them.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "${root}"
build="${1:-build/release}"
if [[ ! -f "${build}/compile_commands.json" ]]; then
  echo "check_tidy: ${build}/compile_commands.json not found: build first (bash scripts/install.sh --no-demo)" >&2
  exit 2
fi
clang_tidy="${CLANG_TIDY:-clang-tidy}"
if ! command -v "${clang_tidy}" > /dev/null; then
  echo "check_tidy: ${clang_tidy} not found (set CLANG_TIDY or install clang-tidy)" >&2
  exit 2
fi

mapfile -t files < <(find csrc/torchmem/core csrc/torchmem/backends -name '*.cc' | sort)
# clang-tidy fails only on errors (WarningsAsErrors is empty): findings are read from its output.
output="$(printf '%s\n' "${files[@]}" |
  xargs -P "${JOBS:-2}" -n 4 "${clang_tidy}" -p "${build}" --quiet \
    --header-filter='csrc/torchmem/(core|backends)/.*' 2>&1)" || true
if grep -E "^[^ ].*: (warning|error): " <<< "${output}"; then
  echo "check_tidy: findings above (in ${#files[@]} files of the engine and the backends)" >&2
  exit 1
fi
echo "check_tidy: ${#files[@]} files of the engine and the backends have no clang-tidy finding"
