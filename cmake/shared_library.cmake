# libtorchmem.so: the engine, the host backend and the CPU glue, shared by
# torchmem._C and torchmem._C_cuda.
#
# Both extension modules must see ONE engine per device and ONE copy of the
# process-wide state around it: the thread-local tag and scope stacks, the
# context-capture hook, the registry of live engines that leak scopes close
# over, the device-engine providers. Linking the static engine into each
# module would give each its own copy. So the static libraries are linked
# whole into this shared library, shipped in the package's lib/ folder, and
# both modules link it (rpath $ORIGIN/lib).
#
# Exports: only torchmem's own C++ symbols (torchmem.map); Abseil and the
# standard library stay internal. -fno-semantic-interposition keeps calls
# inside the library direct (no PLT), so the engine's hot path is as fast as
# in the static build.
set(_torchmem_shared_parts torchmem_core torchmem_backends torchmem_torch_glue)
foreach(_part IN LISTS _torchmem_shared_parts)
  target_compile_options(${_part} PRIVATE -fno-semantic-interposition)
endforeach()

add_library(torchmem_shared SHARED csrc/torchmem/core/shared_library.cc)
set_target_properties(torchmem_shared PROPERTIES
  OUTPUT_NAME torchmem
  LIBRARY_OUTPUT_DIRECTORY ${TORCHMEM_PYTHON_OUTPUT_DIR}/lib
  BUILD_RPATH "${TORCH_PACKAGE_DIR}/lib"
  INSTALL_RPATH "${TORCH_PACKAGE_DIR}/lib"
  LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/torchmem.map)
# Whole archives, spelled out: CMake's WHOLE_ARCHIVE feature refuses a
# library that is also a transitive dependency of another part.
set(_whole_archive -Wl,--whole-archive)
foreach(_part IN LISTS _torchmem_shared_parts)
  list(APPEND _whole_archive $<TARGET_FILE:${_part}>)
endforeach()
list(APPEND _whole_archive -Wl,--no-whole-archive)
add_dependencies(torchmem_shared ${_torchmem_shared_parts})
target_link_libraries(torchmem_shared
  PRIVATE ${_whole_archive}
  # The engine's headers use these (Abseil is itself shared on Debian).
  PUBLIC torchmem_torch absl::btree absl::flat_hash_map absl::flat_hash_set absl::status
         absl::statusor absl::strings absl::str_format Threads::Threads)
target_link_options(torchmem_shared PRIVATE
  -Wl,--version-script=${PROJECT_SOURCE_DIR}/cmake/torchmem.map -Wl,--no-undefined)
target_include_directories(torchmem_shared PUBLIC ${PROJECT_SOURCE_DIR}/csrc)
