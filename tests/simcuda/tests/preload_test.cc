// Programs built against NVIDIA's real runtime run on the simulated device
// when the fake libraries are preloaded: a host program linked with
// CUDA::cudart, and an nvcc-built program that launches a kernel. Also the
// SIMCUDA_* environment (device count, capacity, faults, trace).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/test_util.h"

namespace simcuda_test {
namespace {

TEST(PreloadTest, RealRuntimeFindsNoDeviceWithoutThePreload) {
  const CommandResult r = RunCommand(std::string("env -u LD_PRELOAD ") + SIMCUDA_CUDART_CLIENT);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("device_count=1"), std::string::npos) << r.output;
}

TEST(PreloadTest, ProgramLinkedAgainstTheRealRuntimeRunsOnTheFake) {
  const CommandResult r = RunCommand(PreloadPrefix() + SIMCUDA_CUDART_CLIENT);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("device_count=1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("name=torchmem simulated device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("malloc=0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("roundtrip=ok"), std::string::npos) << r.output;
  // The fake owns the SONAME: the real library is not loaded next to it.
  EXPECT_EQ(r.output.find("version information"), std::string::npos) << r.output;
}

TEST(PreloadTest, EnvironmentConfiguresTheDevice) {
  const CommandResult r = RunCommand("SIMCUDA_DEVICE_COUNT=2 SIMCUDA_MEMORY_BYTES=1G " +
                                     PreloadPrefix() + SIMCUDA_CUDART_CLIENT);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("device_count=2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("total=1073741824"), std::string::npos) << r.output;
}

TEST(PreloadTest, EnvironmentInjectsFaults) {
  const CommandResult r =
      RunCommand("SIMCUDA_FAULTS='cudaMalloc:nth=1:error=cudaErrorMemoryAllocation' " +
                 PreloadPrefix() + SIMCUDA_CUDART_CLIENT);
  EXPECT_NE(r.output.find("malloc=2"), std::string::npos) << r.output;
}

TEST(PreloadTest, TraceListsTheCallsMade) {
  char path[] = "/tmp/simcuda_trace_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  const CommandResult r = RunCommand(std::string("SIMCUDA_TRACE=") + path + " " + PreloadPrefix() +
                                     SIMCUDA_CUDART_CLIENT);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream file(path);
  std::stringstream trace;
  trace << file.rdbuf();
  std::remove(path);
  EXPECT_NE(trace.str().find("runtime cudaMalloc 1\n"), std::string::npos) << trace.str();
  EXPECT_NE(trace.str().find("runtime cudaGetDeviceCount 1\n"), std::string::npos) << trace.str();
}

TEST(PreloadTest, NvccBuiltKernelLaunchRunsOnTheFake) {
  const std::string client = SIMCUDA_KERNEL_CLIENT;
  ASSERT_FALSE(client.empty()) << "nvcc was not found when configuring";
  const CommandResult r = RunCommand(PreloadPrefix() + client);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("launch=0 sync=0 copy=0"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace simcuda_test
