# The torch glue for CPU tensors, the shared library holding the one engine
# both extension modules use, and the Python extension module torchmem._C.
#
# LibTorch comes from the installed torch wheel (no find_package(Torch): its
# config drags in CUDA/cuDNN detection we do not need). We compile against
# its headers with its C++ ABI. libtorchmem.so and _C link only libc10 (CPU
# allocator registry, ThreadLocalDebugInfo), so they load with a CPU-only
# torch; everything CUDA lives in torchmem._C_cuda (cmake/cuda_module.cmake).
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)

execute_process(
  COMMAND ${Python3_EXECUTABLE} -c
    "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(int(torch.version.cuda is not None))"
  OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _torch_result)
if(NOT _torch_result EQUAL 0)
  message(FATAL_ERROR "torchmem needs torch installed for ${Python3_EXECUTABLE}")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 TORCH_PACKAGE_DIR)
list(GET _torch_info 1 TORCH_CXX11_ABI)
list(GET _torch_info 2 TORCH_HAS_CUDA)

execute_process(
  COMMAND ${Python3_EXECUTABLE} -m pybind11 --cmakedir
  OUTPUT_VARIABLE pybind11_DIR OUTPUT_STRIP_TRAILING_WHITESPACE)
find_package(pybind11 CONFIG REQUIRED)

add_library(torchmem_torch INTERFACE)
target_include_directories(torchmem_torch SYSTEM INTERFACE
  ${TORCH_PACKAGE_DIR}/include
  ${TORCH_PACKAGE_DIR}/include/torch/csrc/api/include)
target_compile_definitions(torchmem_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI})
target_link_libraries(torchmem_torch INTERFACE ${TORCH_PACKAGE_DIR}/lib/libc10.so)

# Every target that links the engine must share the torch wheel's C++ ABI:
# std::string crosses from the engine (absl::Status messages, reports)
# through the torch glue into c10 (TORCH_CHECK, c10::Error). A usage
# requirement of torchmem_core reaches every target that links it, in any
# directory, whenever it is created; torchmem_torch carries it to targets
# that use torch's headers without the engine.
target_compile_definitions(torchmem_core PUBLIC _GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI})

add_library(torchmem_torch_glue STATIC
  csrc/torchmem/torch/attribution_propagation.cc
  csrc/torchmem/torch/cpu_allocator.cc
)
target_link_libraries(torchmem_torch_glue PUBLIC torchmem_backends torchmem_torch)

include(cmake/shared_library.cmake)

# The *.c files are the per-version CPython frame walkers (frame_walk.h).
file(GLOB TORCHMEM_PYTHON_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/csrc/torchmem/python/*.cc
     ${PROJECT_SOURCE_DIR}/csrc/torchmem/python/*.c)
pybind11_add_module(_C MODULE ${TORCHMEM_PYTHON_SOURCES})
target_link_libraries(_C PRIVATE torchmem_shared torchmem_torch)
if(TARGET torchmem_cuda_backend)  # recorded in _C.build_info (build_info.cc)
  target_compile_definitions(_C PRIVATE
    TORCHMEM_BUILT_CUDA_VERSION="${CUDAToolkit_VERSION_MAJOR}.${CUDAToolkit_VERSION_MINOR}")
endif()
# CPython's internal frame layout (pycore_frame.h) for GIL-free stack capture.
target_include_directories(_C PRIVATE ${Python3_INCLUDE_DIRS}/internal)
# libtorchmem.so sits in lib/ next to the module. torch's libraries are
# loaded by `import torch` before torchmem._C; their rpath only helps tools
# that load the module on its own.
set_target_properties(_C PROPERTIES
  BUILD_RPATH "\$ORIGIN/lib;${TORCH_PACKAGE_DIR}/lib"
  INSTALL_RPATH "\$ORIGIN/lib;${TORCH_PACKAGE_DIR}/lib"
  LIBRARY_OUTPUT_DIRECTORY ${TORCHMEM_PYTHON_OUTPUT_DIR})

# What setup.py builds: every module of the package for this torch.
add_custom_target(torchmem_python_modules ALL DEPENDS _C torchmem_shared)
