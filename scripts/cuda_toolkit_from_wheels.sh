#!/usr/bin/env bash
# Assembles a CUDA-toolkit-shaped folder (include/, lib64/libcudart.so,
# bin/nvcc) from NVIDIA's pip wheels, for machines without /usr/local/cuda.
#   bash scripts/cuda_toolkit_from_wheels.sh <output dir>
set -euo pipefail
OUT=$1
PYTHON=${PYTHON:-python3}
NVIDIA=$($PYTHON -c "import nvidia, os; print(os.path.dirname(nvidia.__path__[0]) + '/nvidia')")
CU=$NVIDIA/cu13
[[ -f $CU/include/cuda_runtime_api.h ]] || { echo "no CUDA 13 headers in $CU" >&2; exit 1; }
mkdir -p "$OUT/lib64" "$OUT/bin"
ln -sfn "$CU/include" "$OUT/include"
ln -sf "$CU/lib/libcudart.so.13" "$OUT/lib64/libcudart.so.13"
ln -sf "$CU/lib/libcudart.so.13" "$OUT/lib64/libcudart.so"
[[ -x $CU/bin/nvcc ]] && ln -sf "$CU/bin/nvcc" "$OUT/bin/nvcc"
echo "CUDA toolkit folder: $OUT"
