# torchmem._C_cuda: torchmem as PyTorch's complete CUDA allocator (a
# c10::cuda::CUDACachingAllocator::CUDAAllocator subclass), the
# CUDAPluggableAllocator entry points of the reduced route, the CUDA
# engines and the CUDA backend.
#
# Built only for a CUDA build of torch. Uses torch's bundled pybind11 (the
# headers under torch/include) so that the allocator object it returns is
# a torch._C._cuda_CUDAAllocator that change_current_allocator accepts; it
# never includes pip's pybind11. Links torch's CUDA libraries and the shared
# CUDA runtime (so the simulated device can stand in for it), and
# libtorchmem.so for the engine, which it shares with torchmem._C.
if(NOT TORCH_HAS_CUDA)
  message(STATUS "torch has no CUDA: torchmem._C_cuda is not built")
  return()
endif()

set(_torch_lib ${TORCH_PACKAGE_DIR}/lib)
Python3_add_library(_C_cuda MODULE WITH_SOABI
  csrc/torchmem/backends/cuda_backend.cc
  csrc/torchmem/backends/cuda_driver.cc
  csrc/torchmem/backends/cuda_address_registry.cc
  csrc/torchmem/backends/cuda_streams.cc
  csrc/torchmem/python/cuda/module.cc
  csrc/torchmem/torch/cuda/alloc_config.cc
  csrc/torchmem/torch/cuda/cuda_allocator.cc
  csrc/torchmem/torch/cuda/cuda_allocator_reports.cc
  csrc/torchmem/torch/cuda/cuda_engines.cc
  csrc/torchmem/torch/cuda/cuda_fork_locks.cc
  csrc/torchmem/torch/cuda/free_memory_callbacks.cc
  csrc/torchmem/torch/cuda/history_contexts.cc
  csrc/torchmem/torch/cuda/ipc.cc
  csrc/torchmem/torch/cuda/ipc_expandable.cc
  csrc/torchmem/torch/cuda/pluggable_entry_points.cc
  csrc/torchmem/torch/cuda/pool_allocator_source.cc
  csrc/torchmem/torch/cuda/trace_tracker_recorder.cc
  csrc/torchmem/torch/cuda/traceback_contexts.cc
)
target_include_directories(_C_cuda SYSTEM PRIVATE
  ${TORCH_PACKAGE_DIR}/include
  ${TORCH_PACKAGE_DIR}/include/torch/csrc/api/include)
target_compile_definitions(_C_cuda PRIVATE TORCHMEM_WITH_CUDA=1)
target_link_libraries(_C_cuda PRIVATE
  torchmem_shared CUDA::cudart
  ${_torch_lib}/libtorch_python.so ${_torch_lib}/libtorch_cuda.so ${_torch_lib}/libtorch.so
  ${_torch_lib}/libtorch_cpu.so ${_torch_lib}/libc10_cuda.so ${_torch_lib}/libc10.so)
set_target_properties(_C_cuda PROPERTIES
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  BUILD_RPATH "\$ORIGIN/lib;${_torch_lib}"
  INSTALL_RPATH "\$ORIGIN/lib;${_torch_lib}"
  LIBRARY_OUTPUT_DIRECTORY ${TORCHMEM_PYTHON_OUTPUT_DIR})
# No link-time optimization here. c10's allocator settings live in statics of
# functions defined inline in its headers (CUDAAllocatorConfig::instance(),
# and before torch 2.13 AcceleratorAllocatorConfig::getConfigParserHook()).
# Each library that uses one carries a copy marked STB_GNU_UNIQUE, and the
# dynamic linker binds every copy to the first one loaded (libc10's), so all
# share one object. GCC's LTO (checked with 12.2) emits the copy as a plain
# global instead: this module then binds to its own, and reads settings c10
# never updates, or registers a hook c10 never calls (on torch 2.12,
# _set_allocator_settings did not reach the engines).
# tests/python/test_extension_check.py checks the built modules for such copies.
set_property(TARGET _C_cuda PROPERTY INTERPROCEDURAL_OPTIMIZATION OFF)
add_dependencies(torchmem_python_modules _C_cuda)
