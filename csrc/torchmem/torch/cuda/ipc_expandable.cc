#include "torchmem/torch/cuda/ipc_expandable.h"

#include <cuda.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include "torchmem/backends/cuda_backend.h"
#include "torchmem/backends/cuda_driver.h"
#include "torchmem/torch/cuda/cuda_allocator_impl.h"
#include "torchmem/torch/cuda/cuda_engines.h"

// Older C libraries lack the names; the kernel has the calls since 5.6.
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace torchmem::torch_glue {
namespace {

constexpr std::int32_t kPosixFileDescriptor = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
// The header's size: handle type and its padding from version 3.
std::size_t HeaderSize(char version) { return version >= 3 ? 32 : 24; }

template <typename T>
void Put(std::string& out, std::size_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof(T));
}
template <typename T>
T Get(const std::string& in, std::size_t at) {
  T value;
  std::memcpy(&value, in.data() + at, sizeof(T));
  return value;
}

const CudaDriver& Driver() {
  absl::StatusOr<const CudaDriver*> driver = GetCudaDriver();
  TORCH_CHECK(driver.ok(),
              "torchmem: CUDA IPC of expandable segments needs the driver's virtual "
              "memory API: ",
              std::string(driver.status().message()));
  return **driver;
}

void CheckDriver(const CudaDriver& driver, CUresult result, const char* call) {
  TORCH_CHECK(result == CUDA_SUCCESS, "torchmem: ", call, " failed: ", driver.Describe(result));
}

// An opened handle's pages; undoes what was done when destroyed.
struct OpenedPages {
  c10::DeviceIndex device = 0;
  CUdeviceptr base = 0;
  std::size_t page_size = 0;
  std::size_t reserved = 0;
  std::size_t mapped = 0;  // pages mapped from base on
  std::vector<CUmemGenericAllocationHandle> handles;

  ~OpenedPages() {
    const CudaDriver& driver = Driver();
    c10::cuda::CUDAGuard guard(device);
    // Deleters must not throw: failures are warnings.
    if (mapped > 0 && driver.cuMemUnmap(base, mapped * page_size) != CUDA_SUCCESS) {
      TORCH_WARN("torchmem: cuMemUnmap of an opened CUDA IPC handle failed");
    }
    for (CUmemGenericAllocationHandle handle : handles) (void)driver.cuMemRelease(handle);
    if (reserved > 0) (void)driver.cuMemAddressFree(base, reserved);
  }
};

}  // namespace

std::string ShareExpandableBlock(int device, Engine& engine, void* ptr, std::ptrdiff_t* offset) {
  absl::StatusOr<Engine::SharedPages> pages = engine.PagesOfBlock(ptr);
  TORCH_CHECK(pages.ok(), std::string(pages.status().message()));
  CudaBackend& backend = CudaBackendOf(device);
  std::string body(HeaderSize(kShareableHandleVersion) + 4 * pages->handles.size(), '\0');
  Put<std::int32_t>(body, 0, static_cast<std::int32_t>(::getpid()));
  Put<std::uint64_t>(body, 8, pages->page_size);
  Put<std::uint64_t>(body, 16, pages->handles.size());
  if (kShareableHandleVersion >= 3) Put<std::int32_t>(body, 24, kPosixFileDescriptor);
  std::size_t at = HeaderSize(kShareableHandleVersion);
  for (PhysicalPage handle : pages->handles) {
    absl::StatusOr<int> fd = backend.ShareablePage(handle);
    TORCH_CHECK(fd.ok(), std::string(fd.status().message()));
    Put<std::int32_t>(body, at, *fd);
    at += 4;
  }
  *offset = static_cast<std::ptrdiff_t>(reinterpret_cast<std::uintptr_t>(ptr) - pages->first_page);
  return body;
}

std::string ExpandableHandleIdentity(std::string body, char version) {
  constexpr std::size_t kPaddings[] = {4, 28};  // after the pid; after the handle type (version 3)
  for (std::size_t at : kPaddings) {
    if (at + 4 <= HeaderSize(version) && at + 4 <= body.size()) Put<std::int32_t>(body, at, 0);
  }
  return body;
}

std::shared_ptr<void> OpenExpandableHandle(const std::string& body, char version,
                                           c10::DeviceIndex device) {
  const std::size_t header = HeaderSize(version);
  TORCH_CHECK(body.size() >= header, "torchmem: malformed expandable-segment IPC handle (",
              body.size(), " bytes)");
  const auto pid = Get<std::int32_t>(body, 0);
  const auto page_size = static_cast<std::size_t>(Get<std::uint64_t>(body, 8));
  const auto count = static_cast<std::size_t>(Get<std::uint64_t>(body, 16));
  TORCH_CHECK(version < 3 || Get<std::int32_t>(body, 24) == kPosixFileDescriptor,
              "torchmem: this expandable-segment IPC handle shares fabric handles "
              "(expandable_segments_handle_type), which torchmem cannot open; share with "
              "POSIX file descriptors (the default)");
  TORCH_CHECK(count > 0 && page_size > 0 && body.size() == header + 4 * count,
              "torchmem: malformed expandable-segment IPC handle (", body.size(), " bytes for ",
              count, " handles)");
  const CudaDriver& driver = Driver();
  c10::cuda::CUDAGuard guard(device);
  auto opened = std::make_shared<OpenedPages>();
  opened->device = device;
  opened->page_size = page_size;

  const long pidfd = ::syscall(SYS_pidfd_open, pid, 0);
  TORCH_CHECK(pidfd != -1, "torchmem: pidfd_open of the sharing process ", pid,
              " failed (CUDA IPC of expandable segments copies its file descriptors): ",
              std::strerror(errno));
  for (std::size_t i = 0; i < count; ++i) {
    const auto their_fd = Get<std::int32_t>(body, header + 4 * i);
    const long fd = ::syscall(SYS_pidfd_getfd, pidfd, their_fd, 0);
    if (fd == -1) {
      const int error = errno;
      ::close(static_cast<int>(pidfd));
      TORCH_CHECK(false, "torchmem: pidfd_getfd of the sharing process's descriptor failed: ",
                  std::strerror(error));
    }
    CUmemGenericAllocationHandle handle = 0;
    const CUresult imported = driver.cuMemImportFromShareableHandle(
        &handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    ::close(static_cast<int>(fd));  // the handle keeps the memory
    if (imported != CUDA_SUCCESS) ::close(static_cast<int>(pidfd));
    CheckDriver(driver, imported, "cuMemImportFromShareableHandle");
    opened->handles.push_back(handle);
  }
  ::close(static_cast<int>(pidfd));

  // The driver's own alignment (its granularity, which every page size is a
  // multiple of): a 20 MiB page is not a power of two.
  CheckDriver(driver, driver.cuMemAddressReserve(&opened->base, count * page_size, 0, 0, 0),
              "cuMemAddressReserve");
  opened->reserved = count * page_size;
  for (std::size_t i = 0; i < count; ++i) {
    CheckDriver(driver,
                driver.cuMemMap(opened->base + i * page_size, page_size, 0, opened->handles[i], 0),
                "cuMemMap");
    opened->mapped = i + 1;
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CheckDriver(driver, driver.cuMemSetAccess(opened->base, count * page_size, &access, 1),
              "cuMemSetAccess");
  void* first = reinterpret_cast<void*>(static_cast<std::uintptr_t>(opened->base));
  // Owned by the aliasing pointer: the pages go when the last user does.
  return std::shared_ptr<void>(opened, first);
}

}  // namespace torchmem::torch_glue
