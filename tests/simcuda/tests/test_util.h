// Shared helpers of simcuda_test: a fixture that puts the simulated device
// back into its configured state around every test, and subprocess/nm
// helpers for the export and preload tests.
#ifndef TORCHMEM_TESTS_SIMCUDA_TESTS_TEST_UTIL_H_
#define TORCHMEM_TESTS_SIMCUDA_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace simcuda_test {

class SimcudaTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs `command` with /bin/sh, capturing its output.
CommandResult RunCommand(const std::string& command);

// "name@@version" (or "name") of every defined dynamic symbol of `library`.
std::set<std::string> DynamicSymbols(const std::string& library);

// LD_PRELOAD=<fake cudart>:<fake driver>, ready to prefix a command.
std::string PreloadPrefix();

// Resident set size of this process in bytes.
size_t ResidentBytes();

}  // namespace simcuda_test

#endif  // TORCHMEM_TESTS_SIMCUDA_TESTS_TEST_UTIL_H_
