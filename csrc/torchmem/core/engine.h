// torchmem's caching allocator engine: the main header of the core layer.
//
// Glossary
//   backend     where segments and events come from (host memory, CUDA).
//   segment     one region obtained from the backend; released only when all
//               of it is free (EmptyCache, or to retry after a failure).
//   block       a piece of a segment: allocated, free (cached), or pending
//               (freed, but other streams may still use it).
//   pool        small (rounded size <= 1 MiB, 2 MiB segments) or large.
//   stream      blocks are cached per stream; a block freed on one stream is
//               reused only on that stream.
//   tag         a name charged with the bytes allocated while it is innermost
//               on the allocating thread (nestable, thread-local).
//   scope       a leak-check region: at its end, the blocks allocated inside
//               and still allocated are reported.
//   context     an opaque id naming where an allocation was made (a Python
//               stack), from an optional capture hook.
//
// Invariants (CheckInvariants verifies them):
//   - every byte of every segment lies in exactly one block;
//   - no free block has a free neighbour (they merge when freed);
//   - each free block is indexed exactly once, allocated/pending ones never;
//   - every statistic equals a recount of the blocks;
//   - per-tag and per-scope counters equal a recount.
//
// Thread safety: every public method may be called from any thread. One
// mutex guards the engine; the backend is called under it; the capture hook
// and the out-of-memory retry hook are called without it.
#ifndef TORCHMEM_CORE_ENGINE_H_
#define TORCHMEM_CORE_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "torchmem/core/mutex.h"
#include "torchmem/core/attribution.h"
#include "torchmem/core/backend.h"
#include "torchmem/core/block.h"
#include "torchmem/core/free_lists.h"
#include "torchmem/core/reports.h"
#include "torchmem/core/size_policy.h"
#include "torchmem/core/stats.h"
#include "torchmem/core/trace.h"

namespace torchmem {

struct EngineOptions {
  SizePolicy policy = SizePolicy::PyTorchDefault();
  // Largest total of segments the engine may hold; 0 means no limit.
  std::size_t memory_limit_bytes = 0;
};

// Called without the engine's lock when an allocation is about to fail for
// lack of memory; returns true if it may have freed memory (e.g. it ran
// Python's garbage collector), in which case the allocation is retried once.
using OutOfMemoryRetryHook = bool (*)();
void SetOutOfMemoryRetryHook(OutOfMemoryRetryHook hook);

// The per-scope list of blocks allocated (or pending) under a scope.
struct ScopeBlocks {
  ScopeId scope = kNoScope;
  Block* head = nullptr;
  std::int64_t blocks = 0;
};

class Engine {
 public:
  // Requests above this are rejected outright: they cannot be rounded
  // without overflow and no device has that much memory.
  static constexpr std::size_t kMaxRequestBytes = std::size_t{1} << 60;

  Engine(std::unique_ptr<Backend> backend, EngineOptions options = {});
  // Returns every segment to the backend. Blocks still allocated become
  // invalid; the torch glue never destroys its engines for this reason.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Allocates `size` bytes for use on `stream`, attributed to the calling
  // thread's current tag and scope. Errors: InvalidArgument (size 0 or above
  // kMaxRequestBytes), ResourceExhausted (out of memory; the message says
  // what was requested, the limit, reserved, allocated, the largest free
  // block, the top tags and what to try), FailedPrecondition (the backend
  // forbids new segments now, e.g. during CUDA graph capture), or a backend
  // error. Nothing changes on error.
  absl::StatusOr<void*> Allocate(std::size_t size, StreamId stream = 0);

  // Frees a block returned by Allocate. Errors (nothing changes): NotFound
  // for a pointer this engine never returned (or that points inside a
  // block), FailedPrecondition for a double free.
  absl::Status Free(void* ptr);
  // As Free, and checks that `requested_size` is the size the block was
  // allocated with (InvalidArgument otherwise).
  absl::Status FreeSized(void* ptr, std::size_t requested_size);

  // Marks an allocated block as used by `stream` (PyTorch's record_stream):
  // after it is freed, it is reused only once work queued on `stream` up to
  // the free has completed.
  absl::Status RecordStream(void* ptr, StreamId stream);

  // Checks pending blocks' events and caches the blocks whose events all
  // completed.
  void ProcessEvents();

  // Merges cached blocks, then returns every fully free segment to the
  // backend. Returns the first backend error, after trying every segment.
  absl::Status EmptyCache();

  // Limits the sum of segment sizes (0 removes the limit). A limit below the
  // bytes already reserved only stops growth.
  void SetMemoryLimit(std::size_t bytes);
  // Limit as a fraction in (0, 1] of the backend's capacity.
  absl::Status SetMemoryFraction(double fraction);
  std::size_t memory_limit() const;

  MemoryStats GetStats() const;
  void ResetPeakStats();
  void ResetAccumulatedStats();

  // Every tag that ever had an allocation in this engine (including kNoTag).
  std::vector<TagUsage> GetTagUsage() const;
  void ResetTagPeaks();

  FragmentationReport GetFragmentation() const;
  std::vector<SegmentInfo> GetSegments() const;
  // Metadata of the allocated block at `ptr` (NotFound if none).
  absl::StatusOr<BlockInfo> GetBlock(const void* ptr) const;
  // The segment containing `ptr` (NotFound if none): PyTorch's
  // getBaseAllocation, used to share memory between processes.
  absl::StatusOr<SegmentInfo> SegmentContaining(const void* ptr) const;
  // Blocks currently allocated (not pending), in allocation order.
  std::vector<BlockInfo> GetAllocatedBlocks() const;

  // Hands over the survivors of a scope that is closing: blocks allocated
  // under `scope` (or under a scope nested in it) that are still allocated
  // or pending. They move to `parent` (if open), so an outer scope still
  // sees them.
  ScopeSurvivors CollectScope(ScopeId scope, ScopeId parent);

  // Verifies the invariants listed at the top of this file.
  absl::Status CheckInvariants() const;

  // Keeps the last `max_entries` events (alloc, free, segment, oom) in a
  // ring; 0 turns recording off and drops the history.
  void SetTraceCapacity(std::size_t max_entries);
  std::vector<TraceEntry> GetTrace() const;

  const SizePolicy& policy() const { return policy_; }

  // fork() support (see fork_safety.cc): hold / release the engine's lock
  // around fork() so the child never inherits it held by a thread that does
  // not exist there.
  void LockForFork() ABSL_EXCLUSIVE_LOCK_FUNCTION(mutex_) { mutex_.Lock(); }
  void UnlockAfterFork() ABSL_UNLOCK_FUNCTION(mutex_) { mutex_.Unlock(); }
  std::string DeviceName() const { return device_name_; }

 private:
  struct StreamLists {
    explicit StreamLists(StreamId id, std::size_t unit)
        : stream(id), pools{FreeLists(unit), FreeLists(unit)} {}
    StreamId stream = 0;
    FreeLists pools[kNumPools];
  };
  struct TagCounters {
    std::int64_t current_bytes = 0;
    std::int64_t peak_bytes = 0;
    std::int64_t current_requested_bytes = 0;
    std::int64_t live_blocks = 0;
    std::int64_t total_allocations = 0;
    std::int64_t total_allocated_bytes = 0;
    bool seen = false;
  };
  struct PendingEvent {
    EventId event;
    Block* block;
  };

  absl::StatusOr<Block*> AllocateLocked(std::size_t size, StreamId stream,
                                        const Attribution& attribution, ContextId context)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<Block*> NewSegment(std::size_t rounded_size, PoolKind pool, StreamId stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<std::uintptr_t> BackendAllocate(std::size_t segment_size, StreamId stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void SplitBlock(Block* block, std::size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void InsertMerged(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void AbsorbNeighbour(Block* block, Block* neighbour) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void MarkAllocated(Block* block, std::size_t requested, const Attribution& attribution,
                     ContextId context) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status FreeLocked(void* ptr, const std::size_t* requested_size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void MakeReusable(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void RecordPendingEvents(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void ProcessEventsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Waits for every pending event; returns the first failure (the blocks
  // of that stream stay pending).
  absl::Status SynchronizeAllEvents() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status ReleaseFreeSegments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  std::string OutOfMemoryMessage(std::size_t size, std::size_t rounded,
                                 const absl::Status& cause) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status UnknownPointerError(std::uintptr_t address) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  StreamLists& ListsFor(StreamId stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  Block* NewBlock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void DeleteBlock(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  TagCounters& CountersFor(TagId tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  ScopeBlocks* ScopeListFor(ScopeId scope) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  static void LinkToScope(Block* block, ScopeBlocks* list);
  static void UnlinkFromScope(Block* block);
  // Bytes a block contributes to inactive_split_bytes: free in a split segment.
  void AddInactiveSplit(const Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void RemoveInactiveSplit(const Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  static BlockInfo DescribeBlock(const Block& block);
  std::int64_t LargestFreeExtentLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const std::unique_ptr<Backend> backend_;
  const SizePolicy policy_;
  const std::string device_name_;

  mutable Mutex mutex_;
  std::size_t memory_limit_ ABSL_GUARDED_BY(mutex_) = 0;
  MemoryStats stats_ ABSL_GUARDED_BY(mutex_);
  std::uint64_t next_sequence_ ABSL_GUARDED_BY(mutex_) = 1;
  std::uint64_t next_segment_registration_ ABSL_GUARDED_BY(mutex_) = 1;
  std::unique_ptr<TraceRing> trace_ ABSL_GUARDED_BY(mutex_);

  // Every block of every segment, free or not, by address.
  absl::flat_hash_map<std::uintptr_t, Block*> blocks_ ABSL_GUARDED_BY(mutex_);
  // Segments by address (ordered, to find the segment around a pointer).
  absl::btree_map<std::uintptr_t, std::unique_ptr<Segment>> segments_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<StreamId, std::unique_ptr<StreamLists>> streams_ ABSL_GUARDED_BY(mutex_);
  StreamLists* last_stream_ ABSL_GUARDED_BY(mutex_) = nullptr;

  // Events recorded for pending blocks, FIFO per stream that used them.
  absl::flat_hash_map<StreamId, std::deque<PendingEvent>> pending_events_ ABSL_GUARDED_BY(mutex_);
  // Streams whose event could not be recorded yet (backend error): retried.
  std::vector<std::pair<StreamId, Block*>> unrecorded_events_ ABSL_GUARDED_BY(mutex_);
  std::size_t outstanding_events_ ABSL_GUARDED_BY(mutex_) = 0;

  std::vector<TagCounters> tags_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<ScopeId, std::unique_ptr<ScopeBlocks>> scopes_ ABSL_GUARDED_BY(mutex_);
  ScopeBlocks* last_scope_ ABSL_GUARDED_BY(mutex_) = nullptr;

  // Recycled Block objects (allocated in chunks, never returned to the heap
  // before the engine dies).
  std::vector<std::unique_ptr<Block[]>> block_chunks_ ABSL_GUARDED_BY(mutex_);
  std::vector<Block*> spare_blocks_ ABSL_GUARDED_BY(mutex_);
};

// Closes `scope` (this thread's innermost scope) and collects its survivors
// from every live engine.
absl::StatusOr<std::vector<ScopeSurvivors>> CloseLeakScope(ScopeId scope);

}  // namespace torchmem

#endif  // TORCHMEM_CORE_ENGINE_H_
