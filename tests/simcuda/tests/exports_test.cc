// The fake libraries' shape: the runtime exports every function the toolkit's
// libcudart.so.13 exports, each in version node libcudart.so.13, under SONAME
// libcudart.so.13; the driver has SONAME libcuda.so.1 and no runtime symbols.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/test_util.h"

namespace simcuda_test {
namespace {

std::string Soname(const std::string& library) {
  const std::string dump = RunCommand(std::string(SIMCUDA_OBJDUMP) + " -p " + library).output;
  const size_t at = dump.find("SONAME");
  if (at == std::string::npos) return "";
  const size_t start = dump.find_first_not_of(' ', at + 6);
  return dump.substr(start, dump.find('\n', start) - start);
}

TEST(ExportsTest, RuntimeExportsEverythingTheToolkitRuntimeExports) {
  const std::set<std::string> real = DynamicSymbols(SIMCUDA_REAL_CUDART);
  const std::set<std::string> fake = DynamicSymbols(SIMCUDA_FAKE_CUDART);
  ASSERT_GT(real.size(), 400u) << "nm found too few exports in " << SIMCUDA_REAL_CUDART;
  std::vector<std::string> missing;
  for (const std::string& symbol : real) {
    if (fake.count(symbol) == 0) missing.push_back(symbol);
  }
  EXPECT_TRUE(missing.empty()) << missing.size() << " missing, first: " << missing.front();
  for (const std::string& symbol : fake) {
    EXPECT_NE(symbol.find(std::string("@@") + SIMCUDA_RUNTIME_SONAME), std::string::npos) << symbol;
  }
}

TEST(ExportsTest, VersionedLookupFindsTheFake) {
  void* handle = dlopen(SIMCUDA_FAKE_CUDART, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr);
  for (const char* name : {"cudaMalloc", "cudaGetErrorString", "__cudaRegisterFatBinary",
                           "__cudaLaunchKernel", "cudaGraphicsMapResources"}) {
    EXPECT_NE(dlvsym(handle, name, SIMCUDA_RUNTIME_SONAME), nullptr) << name;
  }
  dlclose(handle);
}

TEST(ExportsTest, Sonames) {
  EXPECT_EQ(Soname(SIMCUDA_FAKE_CUDART), SIMCUDA_RUNTIME_SONAME);
  EXPECT_EQ(Soname(SIMCUDA_FAKE_DRIVER), "libcuda.so.1");
}

TEST(ExportsTest, DriverKeepsToDriverSymbols) {
  const std::set<std::string> driver = DynamicSymbols(SIMCUDA_FAKE_DRIVER);
  EXPECT_GT(driver.size(), 300u);
  for (const std::string& symbol : driver) {
    EXPECT_TRUE(symbol.rfind("cuda", 0) != 0) << symbol;
    EXPECT_TRUE(symbol.rfind("cu", 0) == 0 || symbol.rfind("simcuda_driver_", 0) == 0) << symbol;
  }
  for (const char* name : {"cuInit", "cuDriverGetVersion", "cuDevicePrimaryCtxGetState",
                           "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent", "cuGetErrorString",
                           "cuGetErrorName", "cuGetProcAddress_v2", "cuLinkCreate_v2"}) {
    EXPECT_EQ(driver.count(name), 1u) << name;
  }
}

}  // namespace
}  // namespace simcuda_test
