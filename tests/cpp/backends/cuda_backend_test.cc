// CudaBackend and an engine over it, on the simulated CUDA device
// (tests/simcuda, preloaded by CTest; see tests/cpp/CMakeLists.txt).
//
// The program links NVIDIA's shared libcudart; the preloaded simulated
// runtime answers instead, and its control API (simcuda_*) is looked up at
// run time so the test also fails clearly when it is not preloaded.
#include "torchmem/backends/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/cpp/support/simcuda_api.h"
#include "torchmem/core/engine.h"

namespace torchmem {
namespace {

using testing::SimCuda;

constexpr int kManualEvents = testing::kSimCudaManualEvents;
constexpr std::size_t kMiB = std::size_t{1} << 20;

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(SimCuda::Get().reset, nullptr);
    SimCuda::Get().reset();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  void TearDown() override { SimCuda::Get().reset(); }
  const SimCuda& sim() { return SimCuda::Get(); }
};

TEST_F(CudaBackendTest, SegmentsAreDeviceMemoryOfItsDevice) {
  CudaBackend backend(0);
  const unsigned long long before = sim().live_bytes(0);
  absl::StatusOr<std::uintptr_t> segment = backend.AllocateSegment(2 * kMiB, 0);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(*segment % 512, 0u);
  EXPECT_EQ(sim().live_bytes(0), before + 2 * kMiB);
  ASSERT_TRUE(backend.ReleaseSegment(*segment, 2 * kMiB).ok());
  EXPECT_EQ(sim().live_bytes(0), before);
  EXPECT_EQ(backend.DeviceName(), "cuda:0");
}

TEST_F(CudaBackendTest, CapacityIsTheDevicesTotalMemory) {
  ASSERT_EQ(sim().set_memory_capacity(0, 3ull << 30), 0);
  CudaBackend backend(0);
  absl::StatusOr<std::size_t> capacity = backend.Capacity();
  ASSERT_TRUE(capacity.ok());
  EXPECT_EQ(*capacity, std::size_t{3} << 30);
}

TEST_F(CudaBackendTest, OutOfMemoryIsResourceExhaustedAndLeavesNoStickyError) {
  ASSERT_EQ(sim().set_memory_capacity(0, 4 * kMiB), 0);
  CudaBackend backend(0);
  absl::StatusOr<std::uintptr_t> segment = backend.AllocateSegment(8 * kMiB, 0);
  EXPECT_TRUE(absl::IsResourceExhausted(segment.status()));
  EXPECT_TRUE(absl::StrContains(segment.status().message(), "cudaErrorMemoryAllocation"))
      << segment.status();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // PyTorch's next check must not see it
}

TEST_F(CudaBackendTest, SegmentsGoToTheBackendsDeviceAndTheCurrentDeviceIsRestored) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  ASSERT_GE(count, 2) << "ctest runs this with SIMCUDA_DEVICE_COUNT=2";
  CudaBackend backend(1);
  const unsigned long long before = sim().live_bytes(1);
  absl::StatusOr<std::uintptr_t> segment = backend.AllocateSegment(2 * kMiB, 0);
  ASSERT_TRUE(segment.ok());
  EXPECT_EQ(sim().live_bytes(1), before + 2 * kMiB);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
  ASSERT_TRUE(backend.ReleaseSegment(*segment, 2 * kMiB).ok());
}

TEST_F(CudaBackendTest, EventsCompleteWhenTheStreamsWorkDoes) {
  ASSERT_EQ(sim().set_event_mode(kManualEvents), 0);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  CudaBackend backend(0);
  absl::StatusOr<EventId> event = backend.RecordEvent(reinterpret_cast<StreamId>(stream));
  ASSERT_TRUE(event.ok());
  EXPECT_FALSE(*backend.QueryEvent(*event));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cudaErrorNotReady is not left behind
  ASSERT_EQ(sim().complete_stream(stream), 0);
  EXPECT_TRUE(*backend.QueryEvent(*event));
  backend.ReleaseEvent(*event);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST_F(CudaBackendTest, EventsArePooled) {
  CudaBackend backend(0);
  const unsigned long long created = sim().call_count("cudaEventCreateWithFlags");
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<EventId> event = backend.RecordEvent(0);
    ASSERT_TRUE(event.ok());
    ASSERT_TRUE(backend.SynchronizeEvent(*event).ok());
    backend.ReleaseEvent(*event);
  }
  EXPECT_EQ(sim().call_count("cudaEventCreateWithFlags"), created + 1);
}

TEST_F(CudaBackendTest, NewSegmentsDuringAGraphCaptureKeepTheCaptureValid) {
  // As PyTorch's allocator: cudaMalloc with the thread's capture mode
  // relaxed, so a global-mode capture is neither refused nor invalidated.
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  Engine engine(std::make_unique<CudaBackend>(0));
  const auto stream_id = reinterpret_cast<StreamId>(stream);
  absl::StatusOr<void*> warm = engine.Allocate(4096, stream_id);
  ASSERT_TRUE(warm.ok());
  ASSERT_TRUE(engine.Free(*warm).ok());

  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  absl::StatusOr<void*> cached = engine.Allocate(4096, stream_id);
  EXPECT_TRUE(cached.ok()) << cached.status();
  const unsigned long long mallocs = sim().call_count("cudaMalloc");
  absl::StatusOr<void*> fresh = engine.Allocate(64 * kMiB, stream_id);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(sim().call_count("cudaMalloc"), mallocs + 1);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);  // still valid
  ASSERT_NE(graph, nullptr);
  (void)cudaGraphDestroy(graph);
  // The thread's own capture mode is back to what it was.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  ASSERT_TRUE(engine.Free(*cached).ok());
  ASSERT_TRUE(engine.Free(*fresh).ok());
  EXPECT_TRUE(engine.CheckInvariants().ok());
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST_F(CudaBackendTest, OutsideACaptureTheThreadsCaptureModeIsLeftAlone) {
  Engine engine(std::make_unique<CudaBackend>(0));
  const unsigned long long exchanges = sim().call_count("cudaThreadExchangeStreamCaptureMode");
  absl::StatusOr<void*> ptr = engine.Allocate(64 * kMiB);
  ASSERT_TRUE(ptr.ok());
  EXPECT_EQ(sim().call_count("cudaThreadExchangeStreamCaptureMode"), exchanges);
  ASSERT_TRUE(engine.Free(*ptr).ok());
}

TEST_F(CudaBackendTest, EngineRetriesAfterAFailedCudaMallocByEmptyingItsCache) {
  Engine engine(std::make_unique<CudaBackend>(0));
  absl::StatusOr<void*> cached = engine.Allocate(5 * kMiB);  // a 20 MiB segment, then cached
  ASSERT_TRUE(cached.ok());
  ASSERT_TRUE(engine.Free(*cached).ok());
  ASSERT_EQ(sim().fail_next("cudaMalloc", 1, cudaErrorMemoryAllocation), 0);
  absl::StatusOr<void*> large = engine.Allocate(30 * kMiB);
  ASSERT_TRUE(large.ok()) << large.status();
  const MemoryStats stats = engine.GetStats();
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_device_free, 1);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_TRUE(engine.Free(*large).ok());
  EXPECT_TRUE(engine.CheckInvariants().ok());
}

TEST_F(CudaBackendTest, EngineOverTheDeviceReusesAcrossStreamsOnlyAfterEvents) {
  ASSERT_EQ(sim().set_event_mode(kManualEvents), 0);
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreate(&side), cudaSuccess);
  Engine engine(std::make_unique<CudaBackend>(0));
  absl::StatusOr<void*> block = engine.Allocate(4096);
  ASSERT_TRUE(block.ok());
  ASSERT_TRUE(engine.RecordStream(*block, reinterpret_cast<StreamId>(side)).ok());
  ASSERT_TRUE(engine.Free(*block).ok());
  absl::StatusOr<void*> other = engine.Allocate(4096);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *block);
  ASSERT_EQ(sim().complete_stream(side), 0);
  absl::StatusOr<void*> again = engine.Allocate(4096);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *block);
  ASSERT_TRUE(engine.Free(*other).ok());
  ASSERT_TRUE(engine.Free(*again).ok());
  EXPECT_TRUE(engine.CheckInvariants().ok());
  ASSERT_EQ(cudaStreamDestroy(side), cudaSuccess);
}

TEST_F(CudaBackendTest, FailedCudaFreeKeepsTheSegmentAndReportsIt) {
  Engine engine(std::make_unique<CudaBackend>(0));
  absl::StatusOr<void*> block = engine.Allocate(4096);
  ASSERT_TRUE(block.ok());
  ASSERT_TRUE(engine.Free(*block).ok());
  ASSERT_EQ(sim().fail_next("cudaFree", 1, cudaErrorLaunchFailure), 0);
  const absl::Status emptied = engine.EmptyCache();
  EXPECT_FALSE(emptied.ok());
  EXPECT_TRUE(absl::StrContains(emptied.message(), "cudaFree")) << emptied;
  EXPECT_EQ(engine.GetStats().segment.all().current, 1);
  EXPECT_TRUE(engine.CheckInvariants().ok());
  EXPECT_TRUE(engine.EmptyCache().ok());
  EXPECT_EQ(engine.GetStats().segment.all().current, 0);
}

TEST_F(CudaBackendTest, FailedEventRecordKeepsTheBlockPendingUntilItSucceeds) {
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreate(&side), cudaSuccess);
  Engine engine(std::make_unique<CudaBackend>(0));
  absl::StatusOr<void*> block = engine.Allocate(4096);
  ASSERT_TRUE(block.ok());
  ASSERT_TRUE(engine.RecordStream(*block, reinterpret_cast<StreamId>(side)).ok());
  ASSERT_EQ(sim().fail_next("cudaEventRecord", 1, cudaErrorLaunchFailure), 0);
  ASSERT_TRUE(engine.Free(*block).ok());
  EXPECT_EQ(engine.GetStats().active.all().current, 1);
  EXPECT_TRUE(engine.CheckInvariants().ok());
  engine.ProcessEvents();  // records now; events complete at once in immediate mode
  engine.ProcessEvents();
  EXPECT_EQ(engine.GetStats().active.all().current, 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(side), cudaSuccess);
}

// --- virtual memory (the driver's cuMem* calls) ------------------------------

TEST_F(CudaBackendTest, VirtualMemoryPagesAreDeviceMemoryMappedIntoAReservedRange) {
  CudaBackend backend(1);  // not the current device: the calls switch to it and back
  absl::StatusOr<std::size_t> page = backend.VirtualMemoryPageSize();
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(*page, 2 * kMiB);  // the device's minimum granularity
  const unsigned long long before = sim().live_bytes(1);
  absl::StatusOr<std::uintptr_t> range = backend.ReserveAddressRange(8 * kMiB);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(*range % *page, 0u);
  EXPECT_EQ(sim().live_bytes(1), before) << "address space costs no memory";
  absl::StatusOr<PhysicalPage> first = backend.CreatePhysicalPage(2 * kMiB);
  absl::StatusOr<PhysicalPage> second = backend.CreatePhysicalPage(2 * kMiB);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(sim().live_bytes(1), before + 4 * kMiB);
  ASSERT_TRUE(backend.MapPage(*range + 2 * kMiB, *first, 2 * kMiB).ok());
  ASSERT_TRUE(backend.MapPage(*range + 4 * kMiB, *second, 2 * kMiB).ok());
  ASSERT_TRUE(backend.SetAccess(*range + 2 * kMiB, 4 * kMiB).ok());
  // A copy across the boundary of the two pages lands in both.
  std::vector<unsigned char> out(kMiB, 0x5a);
  std::vector<unsigned char> back(kMiB, 0);
  void* across = reinterpret_cast<void*>(*range + 4 * kMiB - kMiB / 2);
  // Only device 1 was granted access: device 0 (current) may not copy.
  EXPECT_EQ(cudaMemcpy(across, out.data(), kMiB, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(across, out.data(), kMiB, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), across, kMiB, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(back, out);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);

  const unsigned long long syncs = sim().call_count("cudaStreamSynchronize");
  ASSERT_TRUE(backend.UnmapPages(*range + 2 * kMiB, 4 * kMiB, 0).ok());
  EXPECT_EQ(sim().call_count("cudaStreamSynchronize"), syncs + 1) << "unmapping waits first";
  ASSERT_TRUE(backend.ReleasePhysicalPage(*first).ok());
  ASSERT_TRUE(backend.ReleasePhysicalPage(*second).ok());
  EXPECT_EQ(sim().live_bytes(1), before);
  ASSERT_TRUE(backend.ReleaseAddressRange(*range, 8 * kMiB).ok());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(CudaBackendTest, APhysicalPageBeyondTheDeviceIsResourceExhausted) {
  ASSERT_EQ(sim().set_memory_capacity(0, 2 * kMiB), 0);
  CudaBackend backend(0);
  ASSERT_TRUE(backend.VirtualMemoryPageSize().ok());
  absl::StatusOr<PhysicalPage> fits = backend.CreatePhysicalPage(2 * kMiB);
  ASSERT_TRUE(fits.ok()) << fits.status();
  absl::StatusOr<PhysicalPage> beyond = backend.CreatePhysicalPage(2 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(beyond.status())) << beyond.status();
  EXPECT_TRUE(absl::StrContains(beyond.status().message(), "cuMemCreate")) << beyond.status();
  EXPECT_TRUE(absl::StrContains(beyond.status().message(), "CUDA_ERROR_OUT_OF_MEMORY"))
      << beyond.status();
  ASSERT_TRUE(backend.ReleasePhysicalPage(*fits).ok());
}

TEST_F(CudaBackendTest, APageIsSharedAsOneFileDescriptorClosedWithThePage) {
  CudaBackend backend(0);
  absl::StatusOr<std::size_t> page_size = backend.VirtualMemoryPageSize();
  ASSERT_TRUE(page_size.ok()) << page_size.status();
  absl::StatusOr<PhysicalPage> page = backend.CreatePhysicalPage(*page_size);
  ASSERT_TRUE(page.ok()) << page.status();
  // The driver exports only pages created with a shareable handle type.
  absl::StatusOr<int> fd = backend.ShareablePage(*page);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(*backend.ShareablePage(*page), *fd);  // exported once
  EXPECT_NE(::fcntl(*fd, F_GETFD), -1);
  ASSERT_TRUE(backend.ReleasePhysicalPage(*page).ok());
  EXPECT_EQ(::fcntl(*fd, F_GETFD), -1);  // closed with the page
}

TEST_F(CudaBackendTest, EngineWithVirtualMemoryMapsOnlyThePagesLiveBlocksTouch) {
  Engine engine(std::make_unique<CudaBackend>(0));
  ASSERT_TRUE(engine.SetPlacement(Placement::kVirtualMemory).ok());
  const unsigned long long before = sim().live_bytes(0);
  const unsigned long long creates = sim().call_count("cuMemCreate");
  // The large pool maps 20 MiB pages (PyTorch's kLargeBuffer): both blocks
  // lie in the first, one cuMemCreate of 20 MiB.
  absl::StatusOr<void*> a = engine.Allocate(3 * kMiB);
  absl::StatusOr<void*> b = engine.Allocate(3 * kMiB);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(engine.GetStats().reserved_bytes.all().current, 20 * static_cast<std::int64_t>(kMiB));
  EXPECT_EQ(sim().live_bytes(0), before + 20 * kMiB);
  EXPECT_EQ(sim().call_count("cuMemCreate"), creates + 1);
  EXPECT_EQ(engine.GetStats().vmm.large_page_size, 20 * static_cast<std::int64_t>(kMiB));
  std::vector<unsigned char> out(6 * kMiB);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<unsigned char>(i * 7);
  std::vector<unsigned char> back(6 * kMiB, 0);
  ASSERT_EQ(cudaMemcpy(*a, out.data(), 6 * kMiB, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), *a, 6 * kMiB, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, out);

  const unsigned long long maps = sim().call_count("cuMemMap");
  ASSERT_TRUE(engine.Free(*b).ok());
  absl::StatusOr<void*> again = engine.Allocate(3 * kMiB);  // a cache hit
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(sim().call_count("cuMemMap"), maps) << "a cache hit makes no driver call";
  ASSERT_TRUE(engine.Free(*again).ok());
  ASSERT_TRUE(engine.Free(*a).ok());
  EXPECT_TRUE(engine.CheckInvariants().ok());
  ASSERT_TRUE(engine.EmptyCache().ok());
  EXPECT_EQ(engine.GetStats().reserved_bytes.all().current, 0);
  EXPECT_EQ(sim().live_bytes(0), before);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace torchmem
