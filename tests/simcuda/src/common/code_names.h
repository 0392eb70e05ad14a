// Shapes of the tables that gen_stubs.py generates from the toolkit headers
// (error-code names, driver API aliases) and a lookup over them.
#ifndef TORCHMEM_TESTS_SIMCUDA_SRC_COMMON_CODE_NAMES_H_
#define TORCHMEM_TESTS_SIMCUDA_SRC_COMMON_CODE_NAMES_H_

#include <cstddef>
#include <cstring>

namespace simcuda {

struct CodeName {
  int code;
  const char* name;
};

// "#define cuMemGetInfo cuMemGetInfo_v2" in cuda.h becomes {base, target}.
struct Alias {
  const char* base;
  const char* target;
};

template <size_t N>
const char* NameOf(const CodeName (&table)[N], int code) {
  for (const CodeName& entry : table) {
    if (entry.code == code) return entry.name;
  }
  return nullptr;
}

template <size_t N>
int CodeOf(const CodeName (&table)[N], const char* name) {
  for (const CodeName& entry : table) {
    if (std::strcmp(entry.name, name) == 0) return entry.code;
  }
  return -1;
}

}  // namespace simcuda

#endif  // TORCHMEM_TESTS_SIMCUDA_SRC_COMMON_CODE_NAMES_H_
