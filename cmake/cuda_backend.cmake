# CudaBackend: the only code that includes CUDA headers. It links the
# *shared* CUDA runtime (CUDA::cudart), never the static one, so that the
# simulated runtime in tests/simcuda can stand in for it with LD_PRELOAD.
add_library(torchmem_cuda_backend STATIC csrc/torchmem/backends/cuda_backend.cc
  csrc/torchmem/backends/cuda_driver.cc csrc/torchmem/backends/cuda_address_registry.cc
  csrc/torchmem/backends/cuda_streams.cc)
target_link_libraries(torchmem_cuda_backend PUBLIC torchmem_core CUDA::cudart)
# (torchmem._C_cuda compiles cuda_backend.cc itself, against libtorchmem.so:
# this static library carries its own engine and serves the C++ tests.)
