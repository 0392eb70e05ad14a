// Coverage-guided fuzzer (libFuzzer) of the engine: the input bytes are a
// program of operations on an Engine over FaultInjectingBackend(
// ControlledBackend), checked against a small shadow model after every one.
//
// Operations (one opcode byte, then its arguments; a short input reads as
// zeros, so every byte string is a valid program; see Op below):
//   allocate any size (0, tiny, near the pool/segment/class boundaries,
//   medium, huge, above the request limit) on one of four streams; free
//   (valid, with the right or a wrong size, unknown, interior and double
//   frees); record_stream; complete a stream's (or all) events; process
//   events; empty_cache; push/pop tags (valid and invalid); open/close leak
//   scopes (in and out of order); memory limits, fractions (any double) and
//   the device's capacity; arming and clearing faults of any backend call
//   (once, N times, after K successes, always, at random) with any code;
//   forbidding new segments; trace capacity; reading every report (stats,
//   fragmentation, tag usage, segments, blocks, trace) and resetting peaks;
//   private pools (create, route allocations of one stream or all to them,
//   end routes, release, no-split, use-on-OOM, empty_cache(pool), live
//   allocation checks), CUDA graph captures (mark begin/end), checkpoints of
//   a pool taken and restored, and the PYTORCH_CUDA_ALLOC_CONF knobs
//   (max_split_size, roundup_power2_divisions, garbage collection).
//
// Checked after every operation (any violation aborts, which libFuzzer
// reports as a crash with the input that caused it):
//   - CheckInvariants() is OK;
//   - allocated/requested bytes and allocation counts equal the model;
//     reserved bytes and segments equal what the backend holds;
//   - an error only where the model expects one: invalid requests are
//     InvalidArgument; out of memory only when the limit or capacity is
//     really in the way (or a fault was injected); any other error only when
//     a fault was injected during the operation (and then it names the call
//     and the device) or new segments are forbidden;
//   - reports agree with the stats and the model;
//   - every block belongs to the pool the model routed it to (a private
//     pool's blocks never serve allocations outside it); pool use counts
//     follow the model;
//   - while a capture is underway (or a route is open) no event is
//     recorded, queried or synchronized, and no default-pool segment is
//     released.
// At the end of each input the faults stop, everything is freed and
// empty_cache must return every byte to the backend.
//
// Build and run: tests/fuzz/run_fuzz.sh <seconds>.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "doubles/controlled_backend.h"
#include "doubles/fault_injecting_backend.h"
#include "tests/cpp/support/live_block_model.h"
#include "torchmem/core/attribution.h"
#include "torchmem/core/engine.h"

namespace torchmem {
namespace {

// Aborts with a message: libFuzzer then saves the input as a crash.
#define FUZZ_CHECK(condition, ...)                                                          \
  do {                                                                                      \
    if (!(condition)) {                                                                     \
      std::fprintf(stderr, "engine_fuzzer: check failed: %s\n  at op %d: %s\n", #condition, \
                   op_index_, absl::StrCat(__VA_ARGS__).c_str());                           \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

constexpr std::size_t kDefaultCapacity = std::size_t{1} << 30;  // 1 GiB: OOM is reachable
// The device's capacity is capped at 64 TiB. The engine's accumulated
// counters (Stat::allocated/freed, "bytes ever allocated") are int64: a few
// allocate/free cycles of 2^60-byte blocks on a fake device of unlimited
// capacity overflow them (found by this fuzzer; 8 EiB of churn on a real
// device). With at most 64 TiB per operation and 4096 operations per input
// they stay far below 2^63.
constexpr std::size_t kMaxCapacity = std::size_t{1} << 46;
constexpr std::size_t kMaxLiveBlocks = 256;
constexpr std::size_t kMaxTraceEntries = 1024;
constexpr StreamId kStreams[] = {0, 1, 2, 0x7f00};
constexpr const char* kTagNames[] = {"fuzz-a", "fuzz-b", "fuzz-c"};

// Sizes where the policy changes its mind: rounding, pools, segment sizes,
// the free lists' size classes (32 MiB with 512 B units), the request limit.
constexpr std::size_t kBoundaries[] = {
    1,
    511,
    512,
    513,
    4096,
    kMiB - 512,
    kMiB,
    kMiB + 1,
    2 * kMiB - 512,
    2 * kMiB,
    2 * kMiB + 1,
    10 * kMiB - 512,
    10 * kMiB,
    10 * kMiB + 1,
    20 * kMiB,
    20 * kMiB + 1,
    32 * kMiB - 512,
    32 * kMiB,
    32 * kMiB + 1,
    kGiB,
    Engine::kMaxRequestBytes - 1,
    Engine::kMaxRequestBytes,
    Engine::kMaxRequestBytes + 1,
    std::numeric_limits<std::size_t>::max(),
};

enum Op : std::uint8_t {
  kAllocate,
  kFree,
  kFreeInvalid,
  kRecordStream,
  kCompleteStream,
  kProcessEvents,
  kEmptyCache,
  kTag,
  kScope,
  kSetLimit,
  kSetFraction,
  kSetCapacity,
  kFault,
  kForbid,
  kTraceCapacity,
  kReport,
  kPool,
  kCapture,
  kCheckpoint,
  kConfig,
  kNumOps,
};

constexpr PoolId kPools[] = {{1, 0}, {2, 0}, {0, 3}};

// Reads little-endian integers from the input; zeros once it is exhausted.
class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  std::uint64_t Bytes(int n) {
    std::uint64_t value = 0;
    for (int i = 0; i < n; ++i) {
      const std::uint64_t byte = pos_ < size_ ? data_[pos_] : 0;
      ++pos_;
      value |= byte << (8 * i);
    }
    return value;
  }
  std::uint8_t U8() { return static_cast<std::uint8_t>(Bytes(1)); }
  std::uint16_t U16() { return static_cast<std::uint16_t>(Bytes(2)); }
  std::uint32_t U32() { return static_cast<std::uint32_t>(Bytes(4)); }
  std::uint64_t U64() { return Bytes(8); }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

struct LiveBlock {
  std::size_t requested;
  std::size_t size;  // as handed out (rounded, maybe with an unsplit tail)
  StreamId stream;
  TagId tag;
  ScopeId scope;
  PoolId pool;  // the private pool it was routed to; default: {0, 0}
};

// The fuzzer's model of a private pool.
struct ModelPool {
  int use_count = 0;
  bool exists = false;    // created and not yet deleted by the engine
  bool freeable = false;  // all users released it
  bool no_split = false;
};

struct ModelRoute {
  PoolId pool;
  bool all_streams;
  StreamId stream;
};

class Fuzzer {
 public:
  Fuzzer(const std::uint8_t* data, std::size_t size) : in_(data, size) {
    auto controlled = std::make_unique<ControlledBackend>(
        ControlledBackendOptions{.device_name = "fuzz:0", .capacity_bytes = kDefaultCapacity});
    controlled_ = controlled.get();
    auto faults = std::make_unique<FaultInjectingBackend>(std::move(controlled));
    faults_ = faults.get();
    engine_ = std::make_unique<Engine>(std::move(faults));
    for (std::size_t i = 0; i < std::size(kTagNames); ++i) {
      tags_[i] = *TagRegistry::Intern(kTagNames[i]);
    }
  }

  void Run() {
    while (!in_.done() && op_index_ < 4096) {
      const Op op = static_cast<Op>(in_.U8() % kNumOps);
      if (std::getenv("TORCHMEM_FUZZ_TRACE") != nullptr) {
        std::fprintf(stderr, "op %d: %d\n", op_index_ + 1, static_cast<int>(op));
      }
      const Before before = Snapshot();
      switch (op) {
        case kAllocate:
          DoAllocate(before);
          break;
        case kFree:
          DoFree();
          break;
        case kFreeInvalid:
          DoFreeInvalid();
          break;
        case kRecordStream:
          DoRecordStream();
          break;
        case kCompleteStream:
          DoCompleteStream();
          break;
        case kProcessEvents:
          engine_->ProcessEvents();
          break;
        case kEmptyCache:
          DoEmptyCache(before);
          break;
        case kTag:
          DoTag();
          break;
        case kScope:
          DoScope();
          break;
        case kSetLimit:
          DoSetLimit();
          break;
        case kSetFraction:
          DoSetFraction(before);
          break;
        case kSetCapacity:
          DoSetCapacity();
          break;
        case kFault:
          DoFault();
          break;
        case kForbid:
          DoForbid();
          break;
        case kTraceCapacity:
          DoTraceCapacity();
          break;
        case kReport:
          DoReport();
          break;
        case kPool:
          DoPool(before);
          break;
        case kCapture:
          DoCapture();
          break;
        case kCheckpoint:
          DoCheckpoint();
          break;
        case kConfig:
          DoConfig();
          break;
        case kNumOps:
          break;
      }
      CheckCaptureRules(before);
      CheckPool();
      ++op_index_;
    }
    Finish();
  }

 private:
  struct Before {
    std::int64_t failures;
    std::int64_t reserved;
    int event_calls;
    bool capture_underway;
    std::vector<std::uintptr_t> default_segments;  // only while a capture is underway
  };

  Before Snapshot() const {
    Before before{faults_->total_failures(),
                  engine_->GetStats().reserved_bytes.all().current,
                  EventCalls(),
                  CaptureUnderway(),
                  {}};
    if (before.capture_underway) before.default_segments = DefaultSegments();
    return before;
  }
  std::vector<std::uintptr_t> DefaultSegments() const {
    std::vector<std::uintptr_t> addresses;
    for (const SegmentInfo& segment : engine_->GetSegments()) {
      if (segment.owner.IsDefault()) addresses.push_back(segment.address);
    }
    return addresses;
  }
  int EventCalls() const {
    return faults_->calls(BackendCall::kRecordEvent) + faults_->calls(BackendCall::kQueryEvent) +
           faults_->calls(BackendCall::kSynchronizeEvent);
  }
  bool CaptureUnderway() const { return marked_captures_ > 0 || !routes_.empty(); }

  // The pool the engine must route an allocation on `stream` to.
  PoolId RouteFor(StreamId stream) const {
    for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
      if (it->all_streams || it->stream == stream) return it->pool;
    }
    return kDefaultPool;
  }
  ModelPool& PoolModel(PoolId id) {
    for (std::size_t i = 0; i < std::size(kPools); ++i) {
      if (kPools[i] == id) return pools_[i];
    }
    std::abort();
  }
  // Learns which released pools the engine deleted (they held no segment).
  void SyncDeletedPools() {
    for (std::size_t i = 0; i < std::size(kPools); ++i) {
      ModelPool& pool = pools_[i];
      if (!pool.exists) continue;
      const absl::StatusOr<int> count = engine_->PoolUseCount(kPools[i]);
      if (!count.ok()) {
        FUZZ_CHECK(pool.freeable && absl::IsNotFound(count.status()), "pool ", i,
                   " vanished while it had users: ", count.status().ToString());
        pool = ModelPool{};
        continue;
      }
      FUZZ_CHECK(*count == pool.use_count, "pool ", i, " counts ", *count, " users, the model ",
                 pool.use_count);
    }
  }
  bool InjectedSince(const Before& before) const {
    return faults_->total_failures() != before.failures;
  }

  // An error that is not the caller's fault must come from an injected
  // failure during this operation, and say which call failed on which device.
  void CheckInjected(const absl::Status& status, const Before& before, const char* what) {
    FUZZ_CHECK(InjectedSince(before), what, " failed with no fault injected: ", status.ToString());
    FUZZ_CHECK(absl::StrContains(status.message(), "injected failure of ") &&
                   absl::StrContains(status.message(), " on fuzz:0"),
               what, ": the error does not name the failed call and device: ", status.ToString());
  }

  std::size_t RandomSize() {
    const std::uint8_t kind = in_.U8();
    switch (kind % 8) {
      case 0:
        return 0;
      case 1:
        return in_.U16();
      case 2:
        return in_.U32() % (kMiB + 1);
      case 3: {  // a boundary, nudged by -128..127 bytes
        const std::size_t base = kBoundaries[in_.U8() % std::size(kBoundaries)];
        const auto delta = static_cast<std::int8_t>(in_.U8());
        return base + static_cast<std::size_t>(static_cast<std::int64_t>(delta));
      }
      case 4:
        return in_.U32() % (64 * kMiB);
      case 5:
        return static_cast<std::size_t>(in_.U64());
      case 6:  // near the device's capacity
        return controlled_capacity_ - (in_.U32() % (4 * kMiB));
      default:
        return (std::size_t{1} << (in_.U8() % 64)) + (in_.U8() % 3) - 1;
    }
  }

  StreamId RandomStream() { return kStreams[in_.U8() % std::size(kStreams)]; }

  // The live block chosen by the next byte (the map is small).
  std::map<std::uintptr_t, LiveBlock>::iterator PickLive() {
    auto it = live_.begin();
    std::advance(it, in_.U16() % live_.size());
    return it;
  }

  void DoAllocate(const Before& before) {
    std::size_t size = RandomSize();
    // Under the virtual-memory placement each 2 MiB page of a block is an
    // entry in the engine's page table: a block near the capacity of a
    // multi-TiB controlled device would need tens of millions of them (a
    // real device has about 100 thousand pages), more than the fuzzer's
    // memory. Such blocks stay under 64 GiB; larger than the device they
    // still fail fast.
    constexpr std::size_t kMaxVmmBlock = std::size_t{64} << 30;
    if (engine_->placement() == Placement::kVirtualMemory && size > kMaxVmmBlock &&
        size <= controlled_capacity_ + controlled_capacity_ / 8) {
      size = kMaxVmmBlock;
    }
    const StreamId stream = RandomStream();
    if (live_.size() >= kMaxLiveBlocks) return;
    const std::size_t limit = engine_->memory_limit();
    const absl::StatusOr<void*> ptr = engine_->Allocate(size, stream);
    const MemoryStats stats = engine_->GetStats();
    const std::int64_t reserved = stats.reserved_bytes.all().current;
    if (size == 0 || size > Engine::kMaxRequestBytes) {
      FUZZ_CHECK(absl::IsInvalidArgument(ptr.status()), "Allocate(", size,
                 ") must be InvalidArgument: ", ptr.status().ToString());
      return;
    }
    const SizePolicy& policy = engine_->policy();
    const PoolId expected_pool = RouteFor(stream);
    if (!ptr.ok()) {
      const absl::Status& status = ptr.status();
      if (absl::IsResourceExhausted(status)) {
        FUZZ_CHECK(absl::StrContains(status.message(), "out of memory on fuzz:0"),
                   "an out-of-memory error names the device: ", status.ToString());
        if (InjectedSince(before)) return;
        if (absl::StrContains(status.message(), "no free extent")) {
          CheckRangeHadNoRoom(expected_pool, stream, policy.RoundSize(size));
          return;
        }
        // Without a fault, the retry gave back every free segment: whatever
        // is still reserved holds live or pending blocks, and a new segment
        // really does not fit under the limit or the device's capacity.
        std::size_t segment = policy.SegmentSizeFor(policy.RoundSize(size));
        if (engine_->placement() == Placement::kVirtualMemory) {
          // Pages, not a segment: the block's pages (its pool's page size,
          // at most the large pool's), and one more where it starts inside
          // a page. An upper bound: the check never blames a justified OOM.
          const auto page =
              static_cast<std::size_t>(std::max(stats.vmm.page_size, stats.vmm.large_page_size));
          if (page != 0) {
            const std::size_t pages = (policy.RoundSize(size) + page - 1) / page + 1;
            segment = std::max(segment, pages * page);
          }
        }
        const std::size_t ceiling =
            limit == 0 ? controlled_capacity_ : std::min(limit, controlled_capacity_);
        FUZZ_CHECK(static_cast<std::size_t>(reserved) > ceiling ||
                       segment > ceiling - static_cast<std::size_t>(reserved) ||
                       segment >= (std::size_t{1} << 50),  // fake address space
                   "Allocate(", size, ") ran out of memory with room left: reserved ", reserved,
                   " + segment ", segment, " <= ", ceiling, ": ", status.ToString());
        return;
      }
      if (absl::IsFailedPrecondition(status) && forbidden_) return;
      CheckInjected(status, before, "Allocate");
      return;
    }
    const auto address = reinterpret_cast<std::uintptr_t>(*ptr);
    const absl::StatusOr<BlockInfo> block = engine_->GetBlock(*ptr);
    FUZZ_CHECK(block.ok(), "a new block is known: ", block.status().ToString());
    const std::size_t rounded = policy.RoundSize(size);
    FUZZ_CHECK(address % policy.min_block_size == 0, "blocks are aligned");
    FUZZ_CHECK(block->size >= rounded && block->requested_size == size &&
                   block->state == BlockState::kAllocated && block->stream == stream,
               "block metadata");
    const absl::StatusOr<SegmentInfo> segment = engine_->SegmentContaining(*ptr);
    FUZZ_CHECK(segment.ok(), "a new block lies in a segment");
    // A default-pool allocation may borrow a use-on-OOM pool's block; any
    // other must come from exactly the pool it was routed to.
    const bool lent = expected_pool.IsDefault() && !segment->owner.IsDefault() &&
                      PoolModel(segment->owner).exists;
    FUZZ_CHECK(segment->owner == expected_pool || lent, "an allocation routed to pool (",
               expected_pool.first, ", ", expected_pool.second, ") got a block of pool (",
               segment->owner.first, ", ", segment->owner.second, ")");
    const bool whole = !segment->owner.IsDefault() && PoolModel(segment->owner).no_split;
    // An oversize block is never split: it may exceed the request by the
    // rounding of its dedicated segment, or (from the cache) by less than
    // max_non_split_rounding.
    const std::size_t slack =
        policy.IsOversize(block->size)
            ? std::max({policy.max_non_split_rounding, policy.large_rounding, policy.small_size})
            : policy.small_size;
    FUZZ_CHECK(whole || block->size <= rounded + slack,
               "a block is at most one sliver larger: ", block->size, " for ", size, " rounded ",
               rounded, " slack ", slack, " max_split ", policy.max_split_size);
    FUZZ_CHECK(!live_.contains(address), "a live address is handed out twice");
    auto next = live_.lower_bound(address);
    FUZZ_CHECK(next == live_.end() || next->first >= address + block->size,
               "a new block overlaps the next live block");
    if (next != live_.begin()) {
      auto prev = std::prev(next);
      FUZZ_CHECK(prev->first + prev->second.size <= address,
                 "a new block overlaps the previous live block");
    }
    // Growth respects the limit and the capacity.
    if (reserved > before.reserved) {
      if (limit != 0) {
        FUZZ_CHECK(static_cast<std::size_t>(reserved) <= limit, "reserved ", reserved,
                   " went over the limit ", limit);
      }
      FUZZ_CHECK(static_cast<std::size_t>(reserved) <= controlled_capacity_, "over capacity");
    }
    const TagId tag = tag_stack_.empty() ? kNoTag : tag_stack_.back();
    const ScopeId scope = scope_stack_.empty() ? kNoScope : scope_stack_.back();
    FUZZ_CHECK(block->tag == tag && block->scope == scope, "attribution stamped on the block");
    live_[address] = LiveBlock{size, block->size, stream, tag, scope, segment->owner};
    freed_.push_back(address);  // a later "double free" candidate
  }

  void DoFree() {
    if (live_.empty()) return;
    auto it = PickLive();
    const std::uint8_t mode = in_.U8() % 3;
    void* ptr = reinterpret_cast<void*>(it->first);
    if (mode == 2) {  // wrong size: refused, nothing changes
      const std::size_t wrong = it->second.requested + 1 + in_.U8();
      const absl::Status status = engine_->FreeSized(ptr, wrong);
      FUZZ_CHECK(absl::IsInvalidArgument(status),
                 "FreeSized with a wrong size: ", status.ToString());
      return;
    }
    const absl::Status status =
        mode == 0 ? engine_->Free(ptr) : engine_->FreeSized(ptr, it->second.requested);
    FUZZ_CHECK(status.ok(), "freeing a live block: ", status.ToString());
    live_.erase(it);
  }

  void DoFreeInvalid() {
    const std::uint8_t mode = in_.U8() % 3;
    std::uintptr_t address = 0;
    if (mode == 0 && !live_.empty()) {  // inside a live block
      auto it = PickLive();
      if (it->second.size < 2) return;
      address = it->first + 1 + in_.U32() % (it->second.size - 1);
    } else if (mode == 1 && !freed_.empty()) {  // a pointer handed out before
      address = freed_[in_.U16() % freed_.size()];
    } else {
      address = static_cast<std::uintptr_t>(in_.U64());
    }
    if (live_.contains(address)) return;  // that would be a valid free
    const absl::Status status = engine_->Free(reinterpret_cast<void*>(address));
    FUZZ_CHECK(absl::IsNotFound(status) || absl::IsFailedPrecondition(status),
               "an invalid free is NotFound or FailedPrecondition: ", status.ToString());
    FUZZ_CHECK(absl::StrContains(status.message(), "fuzz:0"), "the error names the device");
    const absl::Status record = engine_->RecordStream(reinterpret_cast<void*>(address), 1);
    FUZZ_CHECK(!record.ok(), "record_stream on a pointer that is not live");
  }

  void DoRecordStream() {
    if (live_.empty()) return;
    auto it = PickLive();
    const absl::Status status =
        engine_->RecordStream(reinterpret_cast<void*>(it->first), RandomStream());
    FUZZ_CHECK(status.ok(), "record_stream on a live block: ", status.ToString());
  }

  void DoCompleteStream() {
    const std::uint8_t mode = in_.U8() % 4;
    if (mode == 0) {
      controlled_->CompleteAll();
    } else if (mode == 1) {
      controlled_->SetAutoComplete(!auto_complete_);
      auto_complete_ = !auto_complete_;
    } else {
      controlled_->CompleteStream(RandomStream());
    }
  }

  void DoEmptyCache(const Before& before) {
    const absl::Status status = engine_->EmptyCache();
    if (!status.ok()) {
      CheckInjected(status, before, "EmptyCache");
      // Releasing a segment, or (virtual memory) unmapping a range's cached
      // pages or giving its address space back; or waiting for the events of
      // freed blocks, when neither querying nor synchronizing one works (the
      // block stays pending and the error is raised, as PyTorch raises it).
      FUZZ_CHECK(absl::StrContains(status.message(), "ReleaseSegment") ||
                     absl::StrContains(status.message(), "UnmapPages") ||
                     absl::StrContains(status.message(), "ReleaseAddressRange") ||
                     absl::StrContains(status.message(), "SynchronizeEvent"),
                 "EmptyCache fails only by releasing or by a failed event: ", status.ToString());
    }
  }

  void DoTag() {
    const std::uint8_t mode = in_.U8() % 5;
    const TagId tag = tags_[in_.U8() % std::size(tags_)];
    switch (mode) {
      case 0:
      case 1:
        if (tag_stack_.size() >= 16) return;
        FUZZ_CHECK(PushTag(tag).ok(), "push a valid tag");
        tag_stack_.push_back(tag);
        return;
      case 2:
        if (tag_stack_.empty()) {
          FUZZ_CHECK(!PopTag(tag).ok(), "pop with no tag open");
        } else {
          FUZZ_CHECK(PopTag(tag_stack_.back()).ok(), "pop the innermost tag");
          tag_stack_.pop_back();
        }
        return;
      case 3:  // pop a tag that is not innermost
        if (!tag_stack_.empty() && tag_stack_.back() == tag) return;
        FUZZ_CHECK(!PopTag(tag).ok(), "popping a tag that is not innermost is refused");
        return;
      default: {  // push an id that was never interned, or "untagged"
        const TagId bogus = in_.U8() % 2 == 0 ? kNoTag : static_cast<TagId>(1u << 30);
        FUZZ_CHECK(!PushTag(bogus).ok(), "pushing an unknown tag id is refused");
        return;
      }
    }
  }

  void DoScope() {
    const std::uint8_t mode = in_.U8() % 4;
    if (mode == 0 || mode == 1) {
      if (scope_stack_.size() >= 8) return;
      scope_stack_.push_back(OpenScope());
      return;
    }
    if (mode == 3 || scope_stack_.empty()) {  // out of order, closed or never opened
      ScopeId bogus = scope_stack_.empty() ? static_cast<ScopeId>(in_.U64() | 1)
                                           : scope_stack_[in_.U8() % scope_stack_.size()];
      if (!scope_stack_.empty() && bogus == scope_stack_.back()) bogus = closed_scope_;
      if (bogus == kNoScope) return;
      const absl::StatusOr<std::vector<ScopeSurvivors>> closed = CloseLeakScope(bogus);
      FUZZ_CHECK(!closed.ok(), "closing scope ", bogus, " out of order is refused");
      return;
    }
    const ScopeId scope = scope_stack_.back();
    const absl::StatusOr<std::vector<ScopeSurvivors>> closed = CloseLeakScope(scope);
    FUZZ_CHECK(closed.ok(), "closing the innermost scope: ", closed.status().ToString());
    scope_stack_.pop_back();
    closed_scope_ = scope;
    // Survivors: live blocks allocated under this scope or one nested in it
    // (ids grow, and nesting is per thread, so: every id from it on).
    std::size_t expected = 0;
    for (const auto& [address, block] : live_) expected += block.scope >= scope;
    std::size_t reported = 0;
    for (const ScopeSurvivors& survivors : *closed) {
      if (survivors.device != "fuzz:0") continue;
      reported += survivors.allocated.size();
      for (const BlockInfo& info : survivors.allocated) {
        auto it = live_.find(info.address);
        FUZZ_CHECK(it != live_.end() && it->second.scope >= scope, "a survivor is live and ours");
      }
      for (const BlockInfo& info : survivors.pending) {
        FUZZ_CHECK(info.state == BlockState::kPendingFree, "pending survivors are pending");
      }
    }
    FUZZ_CHECK(reported == expected, "scope ", scope, " reports ", reported,
               " survivors, the model ", expected);
  }

  void DoSetLimit() {
    const std::uint8_t mode = in_.U8() % 4;
    std::size_t limit = 0;
    if (mode == 1) limit = static_cast<std::size_t>(in_.U32()) << (in_.U8() % 16);
    if (mode == 2) limit = kBoundaries[in_.U8() % std::size(kBoundaries)];
    if (mode == 3) limit = static_cast<std::size_t>(in_.U64());
    engine_->SetMemoryLimit(limit);
    FUZZ_CHECK(engine_->memory_limit() == limit, "the limit is what was set");
  }

  void DoSetFraction(const Before& before) {
    const std::uint8_t mode = in_.U8() % 3;
    double fraction = 0.0;
    if (mode == 0) fraction = in_.U8() / 255.0;
    if (mode == 1) fraction = 1.0 / (1.0 + in_.U32());
    if (mode == 2) {
      const std::uint64_t bits = in_.U64();
      std::memcpy(&fraction, &bits, sizeof(fraction));  // any double: NaN, denormals, ...
    }
    const std::size_t old_limit = engine_->memory_limit();
    const absl::Status status = engine_->SetMemoryFraction(fraction);
    if (!(fraction > 0.0 && fraction <= 1.0)) {
      FUZZ_CHECK(absl::IsInvalidArgument(status), "fraction ", fraction, " is invalid");
      FUZZ_CHECK(engine_->memory_limit() == old_limit, "an invalid fraction changes nothing");
      return;
    }
    if (!status.ok()) {
      CheckInjected(status, before, "SetMemoryFraction");
      FUZZ_CHECK(absl::StrContains(status.message(), "Capacity"), status.ToString());
      FUZZ_CHECK(engine_->memory_limit() == old_limit, "a failed fraction changes nothing");
      return;
    }
    const std::size_t limit = engine_->memory_limit();
    // A fraction always sets a limit (0 would mean "no limit"), at most the
    // capacity, and the fraction of it up to rounding.
    FUZZ_CHECK(limit != 0, "SetMemoryFraction(", fraction, ") of ", controlled_capacity_,
               " bytes removed the limit instead of setting one");
    FUZZ_CHECK(limit <= std::max<std::size_t>(controlled_capacity_, 1),
               "a fraction above the capacity");
    const double expected = fraction * static_cast<double>(controlled_capacity_);
    FUZZ_CHECK(std::fabs(static_cast<double>(limit) - expected) <= 1.0 + expected * 1e-12, "limit ",
               limit, " for fraction ", fraction, " of ", controlled_capacity_);
  }

  // Under virtual memory a request must fit a free extent of the one address
  // range its (pool, stream, size class) reserved. The engine replaces that
  // range only when all of it is free and no capture forbids unmapping (the
  // retry releases it and reserves one sized by the device now); otherwise
  // running out is right even below the limit: the range was reserved while
  // the device was smaller, or its free space lies between live blocks, or
  // the request is larger than any range for this device.
  void CheckRangeHadNoRoom(PoolId pool, StreamId stream, std::size_t rounded) {
    const PoolKind kind = engine_->policy().PoolFor(rounded);
    for (const SegmentInfo& range : engine_->GetSegments(pool)) {
      if (!range.vmm || range.owner != pool || range.stream != stream || range.pool != kind) {
        continue;
      }
      bool all_free = true;
      for (const BlockInfo& block : range.blocks) {
        if (block.state != BlockState::kFree) {
          all_free = false;
          continue;
        }
        FUZZ_CHECK(block.size < rounded, "out of address space for ", rounded,
                   " bytes, yet the free block at ", block.address, " has ", block.size);
      }
      // A range reserved now spans the device's capacity and an eighth.
      const bool fresh_range_fits = rounded <= controlled_capacity_ + controlled_capacity_ / 8;
      FUZZ_CHECK(!all_free || engine_->CaptureUnderway() || !fresh_range_fits,
                 "an all-free range too small for ", rounded, " bytes was kept outside a capture");
      return;
    }
    FUZZ_CHECK(false, "out of address space for ", rounded, " bytes without a range");
  }

  void DoSetCapacity() {
    const std::uint8_t mode = in_.U8() % 3;
    std::size_t capacity = kDefaultCapacity;
    if (mode == 0) capacity = static_cast<std::size_t>(in_.U32()) << (in_.U8() % 20);
    if (mode == 1) capacity = kBoundaries[in_.U8() % std::size(kBoundaries)];
    if (mode == 2) capacity = static_cast<std::size_t>(in_.U64());
    capacity = std::min(capacity, kMaxCapacity);
    controlled_->SetCapacity(capacity);
    controlled_capacity_ = capacity;
  }

  void DoFault() {
    const BackendCall call = kAllBackendCalls[in_.U8() % kNumBackendCalls];
    const std::uint8_t pattern = in_.U8() % 7;
    // Any code but OK (1..16 are absl's codes).
    const auto code = static_cast<absl::StatusCode>(1 + in_.U8() % 16);
    const std::uint8_t n = in_.U8();
    switch (pattern) {
      case 0:
        faults_->FailOnce(call, code);
        break;
      case 1:
        faults_->FailNext(call, 1 + n % 8, code);
        break;
      case 2:
        faults_->FailAfter(call, n % 8, 1 + n / 32, code);
        break;
      case 3:
        faults_->FailAlways(call, code);
        break;
      case 4:
        faults_->Reseed(in_.U16());
        faults_->FailWithProbability(call, (1 + n) / 257.0, code);
        break;
      case 5:
        faults_->Clear(call);
        break;
      default:
        faults_->ClearAll();
        break;
    }
  }

  void DoForbid() {
    forbidden_ = in_.U8() % 2 == 0;
    controlled_->ForbidSegmentAllocation(forbidden_ ? "fuzzer forbids new segments" : "");
  }

  void DoTraceCapacity() {
    trace_capacity_ = in_.U16() % (kMaxTraceEntries + 1);
    engine_->SetTraceCapacity(trace_capacity_);
  }

  void DoReport() {
    const MemoryStats stats = engine_->GetStats();
    const std::int64_t reserved = stats.reserved_bytes.all().current;
    const std::int64_t allocated = stats.allocated_bytes.all().current;
    switch (in_.U8() % 8) {
      case 0: {
        const FragmentationReport report = engine_->GetFragmentation();
        const FreeSpaceStats& all = report.all;
        FUZZ_CHECK(all.reserved_bytes == reserved, "fragmentation: reserved");
        FUZZ_CHECK(all.allocated_bytes == allocated, "fragmentation: allocated");
        FUZZ_CHECK(all.requested_bytes == stats.requested_bytes.all().current,
                   "fragmentation: requested");
        // In a virtual-memory range the mapped pages, not the blocks, are
        // what is reserved: the identity holds for segments only.
        FUZZ_CHECK(stats.vmm.reserved_address_bytes != 0 ||
                       all.free_bytes + all.pending_free_bytes + all.allocated_bytes == reserved,
                   "fragmentation: free + pending + allocated == reserved");
        FUZZ_CHECK(all.largest_free_extent <= all.free_bytes, "fragmentation: largest extent");
        FUZZ_CHECK(all.external_fragmentation >= 0.0 && all.external_fragmentation <= 1.0,
                   "fragmentation ratio");
        FUZZ_CHECK(report.small_pool.reserved_bytes + report.large_pool.reserved_bytes == reserved,
                   "fragmentation: pools");
        std::int64_t by_stream = 0;
        for (const auto& [stream, per] : report.by_stream) by_stream += per.reserved_bytes;
        FUZZ_CHECK(by_stream == reserved, "fragmentation: streams");
        break;
      }
      case 1: {
        std::map<TagId, std::pair<std::int64_t, std::int64_t>> expected;  // bytes, blocks
        for (const auto& [address, block] : live_) {
          expected[block.tag].first += static_cast<std::int64_t>(block.size);
          ++expected[block.tag].second;
        }
        std::int64_t total = 0;
        for (const TagUsage& usage : engine_->GetTagUsage()) {
          const auto want = expected[usage.tag];
          FUZZ_CHECK(usage.current_bytes == want.first && usage.live_blocks == want.second, "tag ",
                     usage.tag, ": ", usage.current_bytes, " bytes in ", usage.live_blocks,
                     " blocks, the model ", want.first, " in ", want.second);
          FUZZ_CHECK(usage.peak_bytes >= usage.current_bytes, "tag peak");
          total += usage.current_bytes;
        }
        FUZZ_CHECK(total == allocated, "tags add up to allocated bytes");
        break;
      }
      case 2: {
        std::int64_t sum = 0;
        const std::vector<SegmentInfo> segments = engine_->GetSegments();
        for (const SegmentInfo& segment : segments) {
          // A virtual-memory range holds its mapped pages, not its address space.
          sum += static_cast<std::int64_t>(segment.mapped_bytes);
          FUZZ_CHECK(segment.vmm || segment.mapped_bytes == segment.size,
                     "a segment holds its size");
          std::uintptr_t at = segment.address;
          for (const BlockInfo& block : segment.blocks) {
            FUZZ_CHECK(block.address == at, "segment blocks are contiguous");
            at += block.size;
          }
          FUZZ_CHECK(at == segment.address + segment.size, "segment blocks cover it");
        }
        FUZZ_CHECK(sum == reserved, "segments add up to reserved bytes");
        FUZZ_CHECK(static_cast<std::int64_t>(segments.size()) == stats.segment.all().current,
                   "segment count");
        break;
      }
      case 3: {
        const std::vector<BlockInfo> blocks = engine_->GetAllocatedBlocks();
        FUZZ_CHECK(blocks.size() == live_.size(), "allocated blocks: ", blocks.size(),
                   " vs the model's ", live_.size());
        for (const BlockInfo& block : blocks) {
          auto it = live_.find(block.address);
          FUZZ_CHECK(it != live_.end() && it->second.requested == block.requested_size,
                     "an allocated block the model does not know");
        }
        break;
      }
      case 4: {
        if (live_.empty()) break;
        auto it = PickLive();
        const absl::StatusOr<BlockInfo> block =
            engine_->GetBlock(reinterpret_cast<void*>(it->first));
        FUZZ_CHECK(block.ok() && block->requested_size == it->second.requested &&
                       block->size == it->second.size && block->tag == it->second.tag,
                   "GetBlock agrees with the model");
        const absl::StatusOr<SegmentInfo> segment =
            engine_->SegmentContaining(reinterpret_cast<void*>(it->first + it->second.size - 1));
        FUZZ_CHECK(segment.ok() && segment->address <= it->first &&
                       it->first + it->second.size <= segment->address + segment->size,
                   "the segment containing a live block");
        break;
      }
      case 5: {
        const std::vector<TraceEntry> trace = engine_->GetTrace();
        FUZZ_CHECK(trace.size() <= trace_capacity_, "trace holds ", trace.size(),
                   " entries, capacity ", trace_capacity_);
        break;
      }
      case 6:
        engine_->ResetPeakStats();
        engine_->ResetAccumulatedStats();
        break;
      default:
        engine_->ResetTagPeaks();
        break;
    }
  }

  PoolId RandomPool() { return kPools[in_.U8() % std::size(kPools)]; }

  void DoPool(const Before& before) {
    // Other operations (a free, an out-of-memory release, EmptyCache) may have
    // emptied a released pool, which the engine then deleted: the model learns
    // that before it predicts what a pool call does.
    SyncDeletedPools();
    const PoolId id = RandomPool();
    ModelPool& pool = PoolModel(id);
    switch (in_.U8() % 8) {
      case 0: {  // MemPool(): create, or one more user
        const absl::Status status = engine_->CreateOrIncrefPool(id);
        if (pool.freeable) {
          FUZZ_CHECK(absl::IsFailedPrecondition(status), "a released pool is not revived");
          break;
        }
        FUZZ_CHECK(status.ok(), "CreateOrIncrefPool: ", status.ToString());
        pool.exists = true;
        ++pool.use_count;
        break;
      }
      case 1: {  // a capture or use_mem_pool: route one stream, or all, to it
        const bool all = in_.U8() % 2 == 0;
        const StreamId stream = RandomStream();
        const bool routed = std::any_of(routes_.begin(), routes_.end(),
                                        [&](const ModelRoute& r) { return r.pool == id; });
        const absl::Status status = engine_->BeginAllocateToPool(
            id, all ? PoolFilter([](StreamId) { return true; })
                    : PoolFilter([stream](StreamId s) { return s == stream; }));
        if (routed || pool.freeable) {
          FUZZ_CHECK(absl::IsFailedPrecondition(status), "BeginAllocateToPool must refuse");
          break;
        }
        FUZZ_CHECK(status.ok(), "BeginAllocateToPool: ", status.ToString());
        pool.exists = true;
        ++pool.use_count;
        routes_.push_back(ModelRoute{id, all, stream});
        break;
      }
      case 2: {  // the capture or use_mem_pool block ends
        auto it = std::find_if(routes_.begin(), routes_.end(),
                               [&](const ModelRoute& r) { return r.pool == id; });
        const absl::Status status = engine_->EndAllocateToPool(id);
        if (it == routes_.end()) {
          FUZZ_CHECK(absl::IsFailedPrecondition(status), "EndAllocateToPool without a route");
          break;
        }
        FUZZ_CHECK(status.ok(), "EndAllocateToPool: ", status.ToString());
        routes_.erase(it);
        break;
      }
      case 3: {  // a user goes (graph reset, MemPool destroyed)
        const absl::Status status = engine_->ReleasePool(id);
        if (!pool.exists) {
          FUZZ_CHECK(absl::IsNotFound(status), "releasing an unknown pool: ", status.ToString());
          break;
        }
        if (pool.use_count == 0) {
          FUZZ_CHECK(!status.ok(), "releasing a pool more often than it was used");
          break;
        }
        FUZZ_CHECK(status.ok(), "ReleasePool: ", status.ToString());
        if (--pool.use_count == 0) pool.freeable = true;
        break;
      }
      case 4: {
        const absl::Status status = engine_->SetPoolNoSplit(id);
        FUZZ_CHECK(status.ok() == pool.exists, "SetPoolNoSplit: ", status.ToString());
        if (status.ok()) pool.no_split = true;
        break;
      }
      case 5: {
        const bool on = in_.U8() % 2 == 0;
        const absl::Status status = engine_->SetPoolUseOnOom(id, on);
        FUZZ_CHECK(status.ok() || (on && !pool.exists), "SetPoolUseOnOom: ", status.ToString());
        break;
      }
      case 6: {
        const absl::Status status = engine_->EmptyCache(id);
        if (!status.ok()) CheckInjected(status, before, "EmptyCache(pool)");
        break;
      }
      default: {  // checkPoolLiveAllocations, exactly the model's blocks of the pool
        absl::flat_hash_set<std::uintptr_t> expected;
        for (const auto& [address, block] : live_) {
          if (block.pool == id) expected.insert(address);
        }
        const absl::StatusOr<bool> matches = engine_->CheckPoolLiveAllocations(id, expected);
        if (!pool.exists) {
          FUZZ_CHECK(absl::IsNotFound(matches.status()), "live check of an unknown pool");
          break;
        }
        FUZZ_CHECK(matches.ok() && *matches, "checkPoolLiveAllocations disagrees with the model");
        if (!expected.empty()) {
          expected.erase(expected.begin());
          FUZZ_CHECK(!*engine_->CheckPoolLiveAllocations(id, expected),
                     "checkPoolLiveAllocations accepts a missing block");
        }
        break;
      }
    }
    SyncDeletedPools();
  }

  void DoCapture() {
    if (in_.U8() % 2 == 0) {
      if (marked_captures_ >= 4) return;
      engine_->MarkCaptureBegin();
      ++marked_captures_;
    } else if (marked_captures_ > 0) {
      engine_->MarkCaptureEnd();
      --marked_captures_;
    }
  }

  void DoCheckpoint() {
    const std::size_t slot = in_.U8() % std::size(checkpoints_);
    const PoolId id = RandomPool();
    ModelPool& pool = PoolModel(id);
    if (in_.U8() % 2 == 0) {
      const absl::StatusOr<PoolCheckpoint> checkpoint = engine_->GetPoolCheckpoint(id);
      if (!pool.exists) {
        FUZZ_CHECK(absl::IsNotFound(checkpoint.status()), "checkpoint of an unknown pool");
        return;
      }
      if (checkpoint.ok()) checkpoints_[slot] = *checkpoint;
      return;
    }
    if (!checkpoints_[slot].has_value()) return;
    const PoolCheckpoint& checkpoint = *checkpoints_[slot];
    const absl::StatusOr<CheckpointRestore> restored = engine_->RestorePoolCheckpoint(checkpoint);
    if (!restored.ok()) {
      // Refused (a segment vanished, blocks wait on other streams, the pool
      // was released): nothing changed, which CheckPool verifies.
      FUZZ_CHECK(
          absl::IsFailedPrecondition(restored.status()) || absl::IsNotFound(restored.status()),
          "RestorePoolCheckpoint: ", restored.status().ToString());
      return;
    }
    for (std::uintptr_t address : restored->freed) {
      auto it = live_.find(address);
      FUZZ_CHECK(it != live_.end() && it->second.pool == checkpoint.pool,
                 "restore freed a block that was not the pool's");
      live_.erase(it);
    }
    const TagId tag = tag_stack_.empty() ? kNoTag : tag_stack_.back();
    const ScopeId scope = scope_stack_.empty() ? kNoScope : scope_stack_.back();
    for (std::uintptr_t address : restored->allocated) {
      const absl::StatusOr<BlockInfo> block = engine_->GetBlock(reinterpret_cast<void*>(address));
      FUZZ_CHECK(block.ok() && block->state == BlockState::kAllocated, "restored block is live");
      FUZZ_CHECK(!live_.contains(address), "restore re-created a live block");
      live_[address] =
          LiveBlock{block->size, block->size, block->stream, tag, scope, checkpoint.pool};
      freed_.push_back(address);
    }
  }

  void DoConfig() {
    SizePolicy policy = engine_->policy();
    switch (in_.U8() % 5) {
      case 4: {
        // Expandable segments on or off: blocks of both kinds then coexist.
        const Placement placement =
            in_.U8() % 2 == 0 ? Placement::kVirtualMemory : Placement::kPyTorch;
        const absl::Status placed = engine_->SetPlacement(placement);
        FUZZ_CHECK(placed.ok() || faults_->total_failures() > 0,
                   "SetPlacement failed with no fault armed: ", placed.ToString());
        return;
      }
      case 0:
        policy.max_split_size =
            in_.U8() % 2 == 0 ? SizePolicy::kNoMaxSplit : (std::size_t{20} + in_.U8() % 64) * kMiB;
        policy.max_non_split_rounding = (in_.U8() % 32) * kMiB;
        break;
      case 1: {
        const std::size_t divisions[] = {0, 1, 2, 4, 8, 16};
        for (std::size_t& d : policy.roundup_power2_divisions) {
          d = divisions[in_.U8() % std::size(divisions)];
        }
        break;
      }
      case 2:
        engine_->SetGarbageCollectionThreshold(in_.U8() % 2 == 0 ? 0.0 : in_.U8() / 255.0);
        return;
      default:
        policy = SizePolicy::PyTorchDefault();
        break;
    }
    const absl::Status status = engine_->SetSizePolicy(policy);
    FUZZ_CHECK(status.ok(), "SetSizePolicy of a valid policy: ", status.ToString());
  }

  // While a capture is underway: no event recorded, queried or waited for,
  // and no segment of the default pool released.
  void CheckCaptureRules(const Before& before) {
    if (!before.capture_underway || !CaptureUnderway()) return;
    FUZZ_CHECK(EventCalls() == before.event_calls, "an event call during a capture");
    std::vector<std::uintptr_t> after = DefaultSegments();
    for (std::uintptr_t address : before.default_segments) {
      FUZZ_CHECK(std::find(after.begin(), after.end(), address) != after.end(),
                 "a default-pool segment was released during a capture");
    }
  }

  // After every operation: the pool is intact and the stats equal the model.
  void CheckPool() {
    const absl::Status matches = testing::CheckEngineMatchesLiveBlocks(*engine_, live_);
    FUZZ_CHECK(matches.ok(), matches.ToString());
    const MemoryStats stats = engine_->GetStats();
    // The backend also holds the pages a failing release could not give
    // back (counted as lost), and virtual-memory ranges count as segments.
    const std::int64_t lost_bytes = stats.vmm.lost_bytes;
    FUZZ_CHECK(static_cast<std::size_t>(stats.reserved_bytes.all().current + lost_bytes) ==
                   controlled_->live_segment_bytes(),
               "reserved ", stats.reserved_bytes.all().current, " and lost ", lost_bytes,
               ", the backend holds ", controlled_->live_segment_bytes());
    FUZZ_CHECK(stats.segment.all().current ==
                   controlled_->live_segments() + controlled_->reserved_ranges(),
               "segment count");
    FUZZ_CHECK(stats.vmm.mapped_bytes == controlled_->mapped_pages() * stats.vmm.page_size,
               "mapped pages");
  }

  // The faults stop: pending work completes, everything is freed, and
  // empty_cache gives every byte back.
  void Finish() {
    op_index_ = -1;
    faults_->ClearAll();
    controlled_->ForbidSegmentAllocation("");
    for (const ModelRoute& route : routes_) {
      FUZZ_CHECK(engine_->EndAllocateToPool(route.pool).ok(), "end a route at the end");
    }
    routes_.clear();
    while (marked_captures_ > 0) {
      engine_->MarkCaptureEnd();
      --marked_captures_;
    }
    for (std::size_t i = 0; i < std::size(kPools); ++i) {
      for (; pools_[i].exists && pools_[i].use_count > 0; --pools_[i].use_count) {
        FUZZ_CHECK(engine_->ReleasePool(kPools[i]).ok(), "release a pool at the end");
      }
    }
    engine_->ProcessEvents();  // records what could not be recorded
    controlled_->CompleteAll();
    engine_->ProcessEvents();
    while (!tag_stack_.empty()) {
      FUZZ_CHECK(PopTag(tag_stack_.back()).ok(), "pop at the end");
      tag_stack_.pop_back();
    }
    while (!scope_stack_.empty()) {
      FUZZ_CHECK(CloseLeakScope(scope_stack_.back()).ok(), "close at the end");
      scope_stack_.pop_back();
    }
    for (const auto& [address, block] : live_) {
      const absl::Status status = engine_->Free(reinterpret_cast<void*>(address));
      FUZZ_CHECK(status.ok(), "final free: ", status.ToString());
    }
    live_.clear();
    controlled_->CompleteAll();
    const absl::Status emptied = engine_->EmptyCache();
    FUZZ_CHECK(emptied.ok(), "final empty_cache: ", emptied.ToString());
    CheckPool();
    const MemoryStats stats = engine_->GetStats();
    FUZZ_CHECK(stats.reserved_bytes.all().current == 0, "every segment went back");
    FUZZ_CHECK(stats.active_bytes.all().current == 0, "nothing is pending");
    FUZZ_CHECK(controlled_->live_events() == 0, "every event was released");
  }

  Reader in_;
  ControlledBackend* controlled_;  // owned by faults_
  FaultInjectingBackend* faults_;  // owned by engine_
  std::unique_ptr<Engine> engine_;
  TagId tags_[std::size(kTagNames)];
  std::size_t controlled_capacity_ = kDefaultCapacity;
  std::map<std::uintptr_t, LiveBlock> live_;
  std::vector<std::uintptr_t> freed_;
  std::vector<TagId> tag_stack_;
  std::vector<ScopeId> scope_stack_;
  ScopeId closed_scope_ = kNoScope;
  std::size_t trace_capacity_ = 0;
  bool forbidden_ = false;
  bool auto_complete_ = false;
  int op_index_ = 0;
  ModelPool pools_[std::size(kPools)];
  std::vector<ModelRoute> routes_;
  int marked_captures_ = 0;
  std::optional<PoolCheckpoint> checkpoints_[2];
};

}  // namespace
}  // namespace torchmem

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  torchmem::Fuzzer fuzzer(data, size);
  fuzzer.Run();
  return 0;
}
