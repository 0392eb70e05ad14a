#include "torchmem/backends/host_backend.h"

#include <cstring>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "torchmem/core/engine.h"

namespace torchmem {
namespace {

TEST(HostBackendTest, SegmentsAreRealWritableMemory) {
  HostBackend backend;
  for (std::size_t size : {std::size_t{2} << 20, std::size_t{64} << 10}) {  // mmap and heap
    absl::StatusOr<std::uintptr_t> address = backend.AllocateSegment(size, 0);
    ASSERT_TRUE(address.ok());
    EXPECT_EQ(*address % 512, 0u);
    std::memset(reinterpret_cast<void*>(*address), 0xAB, size);
    EXPECT_EQ(backend.live_bytes(), size);
    ASSERT_TRUE(backend.ReleaseSegment(*address, size).ok());
  }
  EXPECT_EQ(backend.live_bytes(), 0u);
}

TEST(HostBackendTest, CapacityLimitsLiveSegments) {
  HostBackend backend(HostBackendOptions{.capacity_bytes = 4 << 20});
  absl::StatusOr<std::uintptr_t> first = backend.AllocateSegment(4 << 20, 0);
  ASSERT_TRUE(first.ok());
  absl::StatusOr<std::uintptr_t> second = backend.AllocateSegment(2 << 20, 0);
  EXPECT_TRUE(absl::IsResourceExhausted(second.status()));
  EXPECT_TRUE(absl::StrContains(second.status().message(), "capacity"));
  ASSERT_TRUE(backend.ReleaseSegment(*first, 4 << 20).ok());
  EXPECT_EQ(*backend.Capacity(), std::size_t{4} << 20);
}

TEST(HostBackendTest, CapacityDefaultsToPhysicalMemory) {
  HostBackend backend;
  absl::StatusOr<std::size_t> capacity = backend.Capacity();
  ASSERT_TRUE(capacity.ok());
  EXPECT_GT(*capacity, std::size_t{256} << 20);
}

TEST(HostBackendTest, EventsCompleteAtOnce) {
  HostBackend backend;
  absl::StatusOr<EventId> event = backend.RecordEvent(0);
  ASSERT_TRUE(event.ok());
  EXPECT_TRUE(*backend.QueryEvent(*event));
  EXPECT_TRUE(backend.SynchronizeEvent(*event).ok());
  backend.ReleaseEvent(*event);
}

TEST(HostBackendTest, EngineOverHostMemoryHandsOutUsableBlocks) {
  Engine engine(std::make_unique<HostBackend>(HostBackendOptions{.capacity_bytes = 64 << 20}));
  std::vector<std::pair<char*, std::size_t>> blocks;
  for (std::size_t size : {1u, 700u, 4096u, 100000u, 3u << 20, 12u << 20}) {
    absl::StatusOr<void*> ptr = engine.Allocate(size);
    ASSERT_TRUE(ptr.ok()) << ptr.status();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(*ptr) % 64, 0u);  // c10 needs 64-byte alignment
    std::memset(*ptr, static_cast<int>(size & 0xFF), size);
    blocks.emplace_back(static_cast<char*>(*ptr), size);
  }
  for (auto [ptr, size] : blocks) {
    EXPECT_EQ(static_cast<unsigned char>(ptr[size - 1]), size & 0xFF);
    ASSERT_TRUE(engine.Free(ptr).ok());
  }
  ASSERT_TRUE(engine.EmptyCache().ok());
  EXPECT_TRUE(engine.CheckInvariants().ok());
  const absl::StatusOr<void*> too_big = engine.Allocate(100 << 20);
  EXPECT_TRUE(absl::IsResourceExhausted(too_big.status()));
}

}  // namespace
}  // namespace torchmem
