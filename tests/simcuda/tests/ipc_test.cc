// CUDA IPC on the simulated device: memory and events shared with a forked
// process (which stands for the receiving process of torch.multiprocessing).
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace simcuda_test {
namespace {

class IpcTest : public SimcudaTest {};

// Runs `child` in a forked process; returns its exit code.
int InChild(const std::function<int()>& child) {
  const pid_t pid = fork();
  if (pid == 0) _exit(child());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

TEST_F(IpcTest, AnotherProcessSeesAndWritesTheSharedMemory) {
  void* ptr = nullptr;
  ASSERT_EQ(cudaMalloc(&ptr, 3 << 20), cudaSuccess);
  std::memset(ptr, 5, 3 << 20);
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, ptr), cudaSuccess);
  // Sharing keeps the address and the data.
  EXPECT_EQ(static_cast<unsigned char*>(ptr)[(3 << 20) - 1], 5);
  cudaIpcMemHandle_t again;
  ASSERT_EQ(cudaIpcGetMemHandle(&again, ptr), cudaSuccess);
  EXPECT_EQ(std::memcmp(&handle, &again, sizeof(handle)), 0);

  const int code = InChild([&handle] {
    void* opened = nullptr;
    if (cudaIpcOpenMemHandle(&opened, handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
      return 1;
    }
    cudaPointerAttributes attributes;
    if (cudaPointerGetAttributes(&attributes, opened) != cudaSuccess ||
        attributes.type != cudaMemoryTypeDevice) {
      return 2;
    }
    if (static_cast<unsigned char*>(opened)[12345] != 5) return 3;
    std::memset(opened, 9, 4096);
    return cudaIpcCloseMemHandle(opened) == cudaSuccess ? 0 : 4;
  });
  EXPECT_EQ(code, 0);
  EXPECT_EQ(static_cast<unsigned char*>(ptr)[0], 9);  // written by the other process
  EXPECT_EQ(static_cast<unsigned char*>(ptr)[4096], 5);
  ASSERT_EQ(cudaFree(ptr), cudaSuccess);
  // Freed by its owner: no one can open it any more.
  EXPECT_EQ(InChild([&handle] {
              void* opened = nullptr;
              return cudaIpcOpenMemHandle(&opened, handle, 0) == cudaErrorInvalidValue ? 0 : 1;
            }),
            0);
}

TEST_F(IpcTest, ObjectsAnEarlierProcessWithThisPidLeftBehindDoNotStopSharing) {
  // A process that ends without freeing what it shared leaves its shared
  // memory object, named after its pid; a later process can get that pid.
  std::vector<std::string> left_behind;
  for (int n = 0; n < 256; ++n) {
    left_behind.push_back("/simcuda-" + std::to_string(getpid()) + "-" + std::to_string(n));
    const int fd = shm_open(left_behind.back().c_str(), O_CREAT | O_RDWR, 0600);
    if (fd >= 0) close(fd);
  }
  void* ptr = nullptr;
  ASSERT_EQ(cudaMalloc(&ptr, 4096), cudaSuccess);
  cudaIpcMemHandle_t handle;
  EXPECT_EQ(cudaIpcGetMemHandle(&handle, ptr), cudaSuccess);
  ASSERT_EQ(cudaFree(ptr), cudaSuccess);
  for (const std::string& name : left_behind) shm_unlink(name.c_str());
}

TEST_F(IpcTest, AProcessCannotOpenItsOwnHandle) {
  void* ptr = nullptr;
  ASSERT_EQ(cudaMalloc(&ptr, 4096), cudaSuccess);
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, ptr), cudaSuccess);
  void* opened = nullptr;
  EXPECT_EQ(cudaIpcOpenMemHandle(&opened, handle, 0), cudaErrorDeviceUninitialized);
  (void)cudaGetLastError();
  // Only the base of a device allocation can be shared.
  EXPECT_EQ(cudaIpcGetMemHandle(&handle, static_cast<char*>(ptr) + 512), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  ASSERT_EQ(cudaFree(ptr), cudaSuccess);
}

TEST_F(IpcTest, InterprocessEventsOpenCompleteInTheOtherProcess) {
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess),
            cudaSuccess);
  cudaIpcEventHandle_t handle;
  ASSERT_EQ(cudaIpcGetEventHandle(&handle, event), cudaSuccess);
  EXPECT_EQ(InChild([&handle] {
              cudaEvent_t opened = nullptr;
              if (cudaIpcOpenEventHandle(&opened, handle) != cudaSuccess) return 1;
              if (cudaEventQuery(opened) != cudaSuccess) return 2;
              return cudaEventDestroy(opened) == cudaSuccess ? 0 : 3;
            }),
            0);
  cudaEvent_t plain = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming), cudaSuccess);
  EXPECT_EQ(cudaIpcGetEventHandle(&handle, plain), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  ASSERT_EQ(cudaEventDestroy(plain), cudaSuccess);
  ASSERT_EQ(cudaEventDestroy(event), cudaSuccess);
}

}  // namespace
}  // namespace simcuda_test
