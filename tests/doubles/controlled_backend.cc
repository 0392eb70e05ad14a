#include "doubles/controlled_backend.h"

#include <sys/mman.h>

#include "absl/strings/str_format.h"
#include "torchmem/core/format.h"

namespace torchmem {
namespace {

// Gap between fake segments, so an off-by-one address never lands in the
// next segment.
constexpr std::uintptr_t kAddressGap = std::uintptr_t{2} << 20;
// Fake segments are handed out in [kAddressBase, kAddressLimit); a request
// that does not fit fails like a full device (fuzzers ask for absurd sizes).
constexpr std::uintptr_t kAddressBase = std::uintptr_t{1} << 44;
constexpr std::uintptr_t kAddressLimit = std::uintptr_t{1} << 62;

}  // namespace

ControlledBackend::ControlledBackend(ControlledBackendOptions options) : options_(options) {}

ControlledBackend::~ControlledBackend() {
  MutexLock lock(&mutex_);
  if (!options_.real_memory) return;
  for (const auto& [address, size] : segments_) munmap(reinterpret_cast<void*>(address), size);
  for (const auto& [address, size] : ranges_) munmap(reinterpret_cast<void*>(address), size);
}

void ControlledBackend::CompleteStream(StreamId stream) {
  MutexLock lock(&mutex_);
  StreamProgress& progress = streams_[stream];
  progress.completed = progress.recorded;
}

void ControlledBackend::CompleteAll() {
  MutexLock lock(&mutex_);
  for (auto& [stream, progress] : streams_) progress.completed = progress.recorded;
}

void ControlledBackend::SetAutoComplete(bool auto_complete) {
  MutexLock lock(&mutex_);
  options_.auto_complete_events = auto_complete;
}

void ControlledBackend::SetCapacity(std::size_t bytes) {
  MutexLock lock(&mutex_);
  options_.capacity_bytes = bytes;
}

void ControlledBackend::ForbidSegmentAllocation(std::string reason) {
  MutexLock lock(&mutex_);
  forbid_reason_ = std::move(reason);
}

std::size_t ControlledBackend::live_segment_bytes() const {
  MutexLock lock(&mutex_);
  return live_bytes_;
}

std::int64_t ControlledBackend::live_segments() const {
  MutexLock lock(&mutex_);
  return static_cast<std::int64_t>(segments_.size());
}

std::int64_t ControlledBackend::live_events() const {
  MutexLock lock(&mutex_);
  return static_cast<std::int64_t>(events_.size());
}

absl::Status ControlledBackend::CheckFits(std::size_t size) const {
  // Written so that no sum can overflow, whatever the capacity and size.
  if (live_bytes_ > options_.capacity_bytes || size > options_.capacity_bytes - live_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s is full: %s of %s in use", options_.device_name,
                        FormatBytes(static_cast<std::int64_t>(live_bytes_)),
                        FormatBytes(static_cast<std::int64_t>(options_.capacity_bytes))));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::uintptr_t> ControlledBackend::FakeAddresses(std::size_t size) {
  const std::uintptr_t limit_left = kAddressLimit - kAddressBase - used_address_space_;
  if (limit_left < 2 * kAddressGap || size > limit_left - 2 * kAddressGap) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: no fake address range of %d bytes is left", options_.device_name, size));
  }
  const std::uintptr_t stride = (size + kAddressGap - 1) / kAddressGap * kAddressGap + kAddressGap;
  const std::uintptr_t address = options_.top_down_addresses
                                     ? kAddressLimit - used_address_space_ - stride
                                     : kAddressBase + used_address_space_;
  used_address_space_ += stride;
  return address;
}

absl::StatusOr<std::uintptr_t> ControlledBackend::AllocateSegment(std::size_t size,
                                                                  StreamId stream) {
  (void)stream;
  MutexLock lock(&mutex_);
  if (absl::Status fits = CheckFits(size); !fits.ok()) return fits;
  std::uintptr_t address = 0;
  if (options_.real_memory) {
    void* memory = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return absl::ResourceExhaustedError("mmap failed");
    address = reinterpret_cast<std::uintptr_t>(memory);
  } else {
    absl::StatusOr<std::uintptr_t> fake = FakeAddresses(size);
    if (!fake.ok()) return fake.status();
    address = *fake;
  }
  segments_.emplace(address, size);
  live_bytes_ += size;
  return address;
}

absl::Status ControlledBackend::ReleaseSegment(std::uintptr_t address, std::size_t size) {
  MutexLock lock(&mutex_);
  auto it = segments_.find(address);
  if (it == segments_.end() || it->second != size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ReleaseSegment(%#x, %d): no such segment on %s", address, size, options_.device_name));
  }
  if (options_.real_memory) munmap(reinterpret_cast<void*>(address), size);
  segments_.erase(it);
  live_bytes_ -= size;
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> ControlledBackend::Capacity() {
  MutexLock lock(&mutex_);
  return options_.capacity_bytes;
}

absl::Status ControlledBackend::CheckSegmentAllocationAllowed(StreamId stream) {
  (void)stream;
  MutexLock lock(&mutex_);
  if (forbid_reason_.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(forbid_reason_);
}

absl::StatusOr<EventId> ControlledBackend::RecordEvent(StreamId stream) {
  MutexLock lock(&mutex_);
  StreamProgress& progress = streams_[stream];
  const EventId id = next_event_++;
  events_.emplace(id, Event{stream, ++progress.recorded});
  return id;
}

absl::StatusOr<bool> ControlledBackend::QueryEvent(EventId event) {
  MutexLock lock(&mutex_);
  auto it = events_.find(event);
  if (it == events_.end()) return absl::InvalidArgumentError("QueryEvent: unknown event");
  if (options_.auto_complete_events) return true;
  return streams_[it->second.stream].completed >= it->second.position;
}

absl::Status ControlledBackend::SynchronizeEvent(EventId event) {
  MutexLock lock(&mutex_);
  auto it = events_.find(event);
  if (it == events_.end()) return absl::InvalidArgumentError("SynchronizeEvent: unknown event");
  StreamProgress& progress = streams_[it->second.stream];
  progress.completed = std::max(progress.completed, it->second.position);
  return absl::OkStatus();
}

void ControlledBackend::ReleaseEvent(EventId event) {
  MutexLock lock(&mutex_);
  events_.erase(event);
}

}  // namespace torchmem

// --- virtual memory ---------------------------------------------------------

namespace torchmem {

std::int64_t ControlledBackend::live_pages() const {
  MutexLock lock(&mutex_);
  return static_cast<std::int64_t>(pages_.size());
}

std::size_t ControlledBackend::live_page_bytes() const {
  MutexLock lock(&mutex_);
  std::size_t bytes = 0;
  for (const auto& [page, created] : pages_) bytes += created.size;
  return bytes;
}

std::int64_t ControlledBackend::mapped_pages() const {
  MutexLock lock(&mutex_);
  return static_cast<std::int64_t>(mappings_.size());
}

std::int64_t ControlledBackend::reserved_ranges() const {
  MutexLock lock(&mutex_);
  return static_cast<std::int64_t>(ranges_.size());
}

absl::StatusOr<std::size_t> ControlledBackend::VirtualMemoryPageSize() {
  if (options_.vmm_page_size == 0) return Backend::VirtualMemoryPageSize();
  return options_.vmm_page_size;
}

absl::StatusOr<std::uintptr_t> ControlledBackend::ReserveAddressRange(std::size_t size) {
  MutexLock lock(&mutex_);
  const std::size_t page = options_.vmm_page_size;
  if (page == 0 || size == 0 || size % page != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ReserveAddressRange(%d): not a positive multiple of the page size", size));
  }
  std::uintptr_t address = 0;
  if (options_.real_memory) {
    // Over-reserve by a page to align the range to a page.
    void* memory =
        mmap(nullptr, size + page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) return absl::ResourceExhaustedError("mmap of a range failed");
    const auto raw = reinterpret_cast<std::uintptr_t>(memory);
    address = (raw + page - 1) / page * page;
    if (address > raw) munmap(memory, address - raw);
    munmap(reinterpret_cast<void*>(address + size), raw + page - address);
  } else {
    absl::StatusOr<std::uintptr_t> fake = FakeAddresses(size);
    if (!fake.ok()) return fake.status();
    address = *fake;  // fake addresses are 2 MiB aligned
  }
  ranges_.emplace(address, size);
  return address;
}

absl::Status ControlledBackend::ReleaseAddressRange(std::uintptr_t address, std::size_t size) {
  MutexLock lock(&mutex_);
  auto it = ranges_.find(address);
  if (it == ranges_.end() || it->second != size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ReleaseAddressRange(%#x, %d): no such range on %s", address, size, options_.device_name));
  }
  for (const auto& [mapped, mapping] : mappings_) {
    if (mapped >= address && mapped < address + size) {
      return absl::FailedPreconditionError(
          absl::StrFormat("ReleaseAddressRange(%#x): page %#x is still mapped", address, mapped));
    }
  }
  if (options_.real_memory) munmap(reinterpret_cast<void*>(address), size);
  ranges_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<PhysicalPage> ControlledBackend::CreatePhysicalPage(std::size_t size) {
  MutexLock lock(&mutex_);
  const std::size_t granule = options_.vmm_page_size;
  if (granule == 0 || size == 0 || size % granule != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CreatePhysicalPage(%d): not a positive multiple of the page size", size));
  }
  if (absl::Status fits = CheckFits(size); !fits.ok()) return fits;
  live_bytes_ += size;
  const PhysicalPage page = next_page_++;
  pages_.emplace(page, Created{size, 0});
  return page;
}

absl::Status ControlledBackend::ReleasePhysicalPage(PhysicalPage page) {
  MutexLock lock(&mutex_);
  auto it = pages_.find(page);
  if (it == pages_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ReleasePhysicalPage(%d): no such page", page));
  }
  if (it->second.mapped_at != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "ReleasePhysicalPage(%d): still mapped at %#x", page, it->second.mapped_at));
  }
  live_bytes_ -= it->second.size;
  pages_.erase(it);
  return absl::OkStatus();
}

absl::Status ControlledBackend::CheckInRange(const char* call, std::uintptr_t address,
                                             std::size_t size) const {
  const std::size_t page = options_.vmm_page_size;
  if (page == 0 || size == 0 || address % page != 0 || size % page != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s(%#x, %d): not whole pages", call, address, size));
  }
  for (const auto& [base, bytes] : ranges_) {
    if (address >= base && address - base < bytes && size <= bytes - (address - base)) {
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("%s(%#x, %d): not inside one reserved range", call, address, size));
}

absl::Status ControlledBackend::MapPage(std::uintptr_t address, PhysicalPage page,
                                        std::size_t size) {
  MutexLock lock(&mutex_);
  if (absl::Status inside = CheckInRange("MapPage", address, size); !inside.ok()) return inside;
  auto it = pages_.find(page);
  if (it == pages_.end() || it->second.mapped_at != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MapPage(%#x, %d): no such page, or it is mapped already", address, page));
  }
  if (it->second.size != size) {
    return absl::InvalidArgumentError(absl::StrFormat("MapPage(%#x, %d, %d): the page has %d bytes",
                                                      address, page, size, it->second.size));
  }
  for (std::uintptr_t at = address; at < address + size; at += options_.vmm_page_size) {
    if (mappings_.contains(at)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("MapPage(%#x): something is mapped at %#x already", address, at));
    }
  }
  for (std::uintptr_t at = address; at < address + size; at += options_.vmm_page_size) {
    mappings_.emplace(at, Mapping{page, false});
  }
  it->second.mapped_at = address;
  return absl::OkStatus();
}

absl::Status ControlledBackend::SetAccess(std::uintptr_t address, std::size_t size) {
  MutexLock lock(&mutex_);
  if (absl::Status inside = CheckInRange("SetAccess", address, size); !inside.ok()) return inside;
  for (std::uintptr_t at = address; at < address + size; at += options_.vmm_page_size) {
    if (!mappings_.contains(at)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("SetAccess(%#x, %d): page %#x is not mapped", address, size, at));
    }
  }
  for (std::uintptr_t at = address; at < address + size; at += options_.vmm_page_size) {
    mappings_[at].accessible = true;
  }
  if (options_.real_memory &&
      mprotect(reinterpret_cast<void*>(address), size, PROT_READ | PROT_WRITE) != 0) {
    return absl::InternalError("SetAccess: mprotect failed");
  }
  return absl::OkStatus();
}

absl::Status ControlledBackend::UnmapPages(std::uintptr_t address, std::size_t size,
                                           StreamId stream) {
  MutexLock lock(&mutex_);
  if (absl::Status inside = CheckInRange("UnmapPages", address, size); !inside.ok()) {
    return inside;
  }
  for (std::uintptr_t at = address; at < address + size; at += options_.vmm_page_size) {
    auto mapping = mappings_.find(at);
    if (mapping == mappings_.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("UnmapPages(%#x, %d): page %#x is not mapped", address, size, at));
    }
    // As cuMemUnmap, a page is unmapped whole or not at all.
    const Created& created = pages_.at(mapping->second.page);
    if (created.mapped_at < address || created.mapped_at + created.size > address + size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "UnmapPages(%#x, %d): the %d-byte page mapped at %#x is not covered whole", address, size,
          created.size, created.mapped_at));
    }
  }
  // Unmapping waits for the stream's queued work, as the CUDA backend does.
  StreamProgress& progress = streams_[stream];
  progress.completed = progress.recorded;
  for (std::uintptr_t at = address; at < address + size; at += options_.vmm_page_size) {
    auto it = mappings_.find(at);
    pages_[it->second.page].mapped_at = 0;
    mappings_.erase(it);
  }
  if (options_.real_memory) {
    // A fresh PROT_NONE mapping drops the pages' contents.
    mmap(reinterpret_cast<void*>(address), size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  }
  return absl::OkStatus();
}

}  // namespace torchmem
