// Helpers of simcuda_test (see test_util.h).
#include "tests/test_util.h"

#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "simcuda_control.h"

namespace simcuda_test {

void SimcudaTest::SetUp() {
  simcuda_set_device_count(1);
  simcuda_reset();
  cudaSetDevice(0);
}

void SimcudaTest::TearDown() {
  simcuda_reset();
  cudaSetDevice(0);
  simcuda_set_device_count(1);
}

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::set<std::string> DynamicSymbols(const std::string& library) {
  std::set<std::string> symbols;
  std::istringstream lines(
      RunCommand(std::string(SIMCUDA_NM) + " -D --defined-only " + library).output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string address, type, name;
    if (fields >> address >> type >> name && (type == "T" || type == "W")) symbols.insert(name);
  }
  return symbols;
}

std::string PreloadPrefix() {
  return std::string("LD_PRELOAD=") + SIMCUDA_FAKE_CUDART + ":" + SIMCUDA_FAKE_DRIVER + " ";
}

size_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace simcuda_test
