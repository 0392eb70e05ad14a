// torchmem's caching allocator engine: the main header of the core layer.
//
// Glossary
//   backend     where segments and events come from (host memory, CUDA).
//   segment     one region obtained from the backend; released only when all
//               of it is free (EmptyCache, or to retry after a failure).
//   block       a piece of a segment: allocated, free (cached), or pending
//               (freed, but other streams may still use it).
//   pool        small (rounded size <= 1 MiB, 2 MiB segments) or large.
//   placement   kPyTorch: segments and best fit exactly as PyTorch's
//               allocator (the default); kVirtualMemory (PyTorch's
//               expandable_segments): per pool, stream and small/large, one
//               address range reserved once (a Segment with vmm set), blocks
//               placed by page fit (page_fit.h), physical pages mapped where
//               live blocks need them (vmm_space.h). Needs a backend with
//               virtual memory; blocks of either kind coexist (the placement
//               may change at run time; new blocks follow it).
//   private pool  a set of segments reserved for a CUDA graph or a
//               torch.cuda.MemPool, named by PyTorch's MempoolId pair
//               (PoolId). Allocations are routed to one while a route is
//               open for it (BeginAllocateToPool: a filter on the stream, as
//               PyTorch decides); its blocks serve only those allocations and
//               its segments are released only after the last user released
//               it (ReleasePool) and they are free.
//   capture     a CUDA graph capture. While one is underway (or a route is
//               open) no event is recorded or queried (CUDA forbids it on a
//               capturing stream) and blocks used on other streams stay
//               pending until it ends.
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
//   - every statistic equals a recount of the blocks, also per private pool;
//     reserved_bytes counts segments' sizes and ranges' mapped pages;
//   - every page of a range that a live block overlaps is mapped, every
//     mapped page lies in exactly one range, and page reference counts equal
//     a recount (VmmSpace::Check);
//   - a private pool's blocks are indexed only in that pool's free lists;
//   - per-tag and per-scope counters equal a recount;
//   - the per-stream event table holds no empty queue.
//
// Thread safety: every public method may be called from any thread. One
// mutex guards the engine; the backend, the routes' filters and the trace
// listener are called under it; the capture hook and the out-of-memory retry
// hook are called without it.
#ifndef TORCHMEM_CORE_ENGINE_H_
#define TORCHMEM_CORE_ENGINE_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "torchmem/core/attribution.h"
#include "torchmem/core/backend.h"
#include "torchmem/core/block.h"
#include "torchmem/core/context_capture.h"
#include "torchmem/core/free_lists.h"
#include "torchmem/core/mutex.h"
#include "torchmem/core/reports.h"
#include "torchmem/core/segment_source.h"
#include "torchmem/core/size_policy.h"
#include "torchmem/core/stats.h"
#include "torchmem/core/trace.h"
#include "torchmem/core/vmm_space.h"

namespace torchmem {

// Where new blocks go (see the glossary).
enum class Placement { kPyTorch, kVirtualMemory };

struct EngineOptions {
  SizePolicy policy = SizePolicy::PyTorchDefault();
  Placement placement = Placement::kPyTorch;
  // Largest total of segments the engine may hold; 0 means no limit.
  std::size_t memory_limit_bytes = 0;
  // PyTorch's garbage_collection_threshold: when a new segment is needed and
  // reserved memory exceeds this fraction of the memory limit, free cached
  // unsplit large blocks, oldest first. 0 (or no limit): off.
  double garbage_collection_threshold = 0.0;
};

// Chooses whether an allocation on `stream` goes to a route's private pool
// (PyTorch's filter: "is this stream capturing into my graph", "is this my
// thread"). Called under the engine's lock: it must not call into the engine.
using PoolFilter = std::function<bool(StreamId stream)>;

// Called under the engine's lock for every trace event while set (PyTorch's
// AllocatorTraceTracker): it must not call into the engine.
using TraceListener = std::function<void(const TraceEntry& entry)>;

// Called without the engine's lock when an allocation is about to fail for
// lack of memory; returns true if it may have freed memory (e.g. it ran
// Python's garbage collector), in which case the allocation is retried once.
// Not called while any engine of the process has a capture underway.
using OutOfMemoryRetryHook = bool (*)();
void SetOutOfMemoryRetryHook(OutOfMemoryRetryHook hook);

// Called without the engine's lock when an allocation finds no cached block
// (PyTorch's placement) or finds no room (virtual-memory placement), before
// the engine asks the backend for memory or runs the out-of-memory ladder;
// returns true if it may have freed memory. The allocation then looks again.
// PyTorch's FreeCudaMemoryCallbacksRegistry (torch's cuda_ipc_collect frees
// the blocks other processes are done with) is run through it.
using CacheMissHook = bool (*)();

// The per-scope list of blocks allocated (or pending) under a scope.
struct ScopeBlocks {
  ScopeId scope = kNoScope;
  Block* head = nullptr;
  std::int64_t blocks = 0;
};

// The free lists of one stream (per pool kind), in the default pool or a
// private pool; also counts the segments indexed in them, so that lists of
// streams that hold no segment any more are dropped.
// Virtual-memory ranges keep their free blocks apart (vmm_pools), so that
// PyTorch's best fit never carves an unmapped range.
struct StreamLists {
  StreamLists(StreamId id, std::size_t unit)
      : stream(id),
        pools{FreeLists(unit), FreeLists(unit)},
        vmm_pools{FreeLists(unit), FreeLists(unit)} {}
  StreamId stream = 0;
  FreeLists pools[kNumPools];
  FreeLists vmm_pools[kNumPools];
  Segment* vmm_ranges[kNumPools] = {nullptr, nullptr};
  std::int64_t segments = 0;  // segments and ranges
};

// A private pool (see the glossary).
struct PrivatePool {
  PoolId id;
  int use_count = 1;        // users holding it (graphs, MemPools, open routes)
  bool freeable = false;    // use_count reached 0: its free segments may be released
  bool no_split = false;    // PyTorch's MemPool(no_split=True): never split its blocks
  bool use_on_oom = false;  // MemPool(use_on_oom=True): default-pool allocations may
                            // take its free blocks before failing
  std::int64_t segments = 0;
  absl::flat_hash_map<StreamId, std::unique_ptr<StreamLists>> streams;
  // The pool's own allocator (MemPool(allocator=...)): its segments come
  // from it, not from the backend, and it never uses virtual memory (as
  // PyTorch's expandable segments skip such pools). nullptr: the backend.
  std::shared_ptr<SegmentSource> source;
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
  // forbids new segments now), or a backend error. Nothing changes on error.
  // While routes are open (BeginAllocateToPool), the newest route whose
  // filter accepts `stream` receives the allocation in its private pool.
  absl::StatusOr<void*> Allocate(std::size_t size, StreamId stream = 0);

  // Frees a block returned by Allocate. Errors (nothing changes): NotFound
  // for a pointer this engine never returned (or that points inside a
  // block), FailedPrecondition for a double free.
  absl::Status Free(void* ptr);
  // As Free, and checks that `requested_size` is the size the block was
  // allocated with (InvalidArgument otherwise).
  absl::Status FreeSized(void* ptr, std::size_t requested_size);
  // As Free, for callers that try several engines: false (and no error
  // message built) if no block of this engine starts at `ptr`.
  absl::StatusOr<bool> FreeIfOwned(void* ptr);

  // Marks an allocated block as used by `stream` (PyTorch's record_stream):
  // after it is freed, it is reused only once work queued on `stream` up to
  // the free has completed.
  absl::Status RecordStream(void* ptr, StreamId stream);

  // Checks pending blocks' events and caches the blocks whose events all
  // completed (nothing while a capture is underway). A query that fails
  // (rather than "not ready") is counted, warned about once, and the event
  // synchronized; if that fails too the block stays pending and the next
  // allocation returns the error (as PyTorch raises it).
  void ProcessEvents();

  // Returns cached memory to the backend, as PyTorch's emptyCache(pool):
  //   - kDefaultPool: waits for every pending block's events (so freed
  //     blocks become free), then releases every fully free segment of the
  //     default pool and of released private pools; while a capture is
  //     underway, only those of released private pools (no waiting);
  //   - a private pool: the same for that pool only, if it was released.
  // Returns the first backend error, after trying every segment.
  absl::Status EmptyCache(PoolId pool = kDefaultPool);

  // --- Private pools (CUDA graphs, MemPool; see the glossary) --------------

  // Creates `pool` with one user, or adds a user (PyTorch's
  // createOrIncrefPool). FailedPrecondition for a pool already released.
  // With a `source`, the pool's segments come from it (segment_source.h);
  // a pool keeps the source it was created with (FailedPrecondition if
  // another one is given later).
  absl::Status CreateOrIncrefPool(PoolId pool, std::shared_ptr<SegmentSource> source = nullptr);
  // Opens a route to `pool` (created or incref'd as above): allocations on
  // streams `filter` accepts go to it until EndAllocateToPool. Routes are
  // searched newest first. FailedPrecondition if a route to it is open.
  absl::Status BeginAllocateToPool(PoolId pool, PoolFilter filter);
  absl::Status EndAllocateToPool(PoolId pool);
  // Drops one user; at zero the pool's free segments become releasable and
  // the pool disappears once it holds no segment.
  absl::Status ReleasePool(PoolId pool);
  absl::StatusOr<int> PoolUseCount(PoolId pool) const;
  absl::Status SetPoolNoSplit(PoolId pool);
  absl::Status SetPoolUseOnOom(PoolId pool, bool use_on_oom);
  // Whether the allocated blocks of `pool` are exactly `expected` (PyTorch's
  // checkPoolLiveAllocations, which cudagraph trees use).
  absl::StatusOr<bool> CheckPoolLiveAllocations(
      PoolId pool, const absl::flat_hash_set<std::uintptr_t>& expected) const;
  // PyTorch's markCaptureBegin/End: a stream capture started/ended.
  void MarkCaptureBegin();
  void MarkCaptureEnd();
  bool CaptureUnderway() const;

  // The layout of `pool` now. FailedPrecondition while any of its blocks
  // waits on events.
  absl::StatusOr<PoolCheckpoint> GetPoolCheckpoint(PoolId pool);
  // Brings `pool` back to `checkpoint`: frees its allocated blocks, then
  // re-creates the checkpoint's live blocks at their addresses (charged to
  // the calling thread's tag and scope). Every segment of the checkpoint
  // must still belong to the pool.
  absl::StatusOr<CheckpointRestore> RestorePoolCheckpoint(const PoolCheckpoint& checkpoint);

  // Chooses where new blocks go. FailedPrecondition for kVirtualMemory if the
  // backend has no virtual memory API.
  absl::Status SetPlacement(Placement placement);
  Placement placement() const;
  // The backend now grants access to its virtual-memory pages to more
  // devices (a peer): sets the access of every page mapped so far again
  // (engine_vmm.cc; issue 20). OK without virtual memory.
  absl::Status RefreshVirtualMemoryAccess();

  // Limits the sum of segment sizes (0 removes the limit). A limit below the
  // bytes already reserved only stops growth.
  void SetMemoryLimit(std::size_t bytes);
  // Adopts a new size policy (PYTORCH_CUDA_ALLOC_CONF changed); existing
  // blocks keep their sizes. InvalidArgument if it does not Validate().
  absl::Status SetSizePolicy(SizePolicy policy);
  void SetGarbageCollectionThreshold(double fraction);
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
  // The segment containing `ptr` (NotFound if none).
  absl::StatusOr<SegmentInfo> SegmentContaining(const void* ptr) const;
  // PyTorch's getBaseAllocation: {first byte, bytes} of the device
  // allocation holding `ptr` (engine_sharing.cc). A segment; in an address
  // range, the run of mapped pages around `ptr` (the range's unmapped address
  // space is no memory: copying or sharing it would fault). NotFound if no
  // segment holds `ptr`.
  absl::StatusOr<std::pair<std::uintptr_t, std::size_t>> BaseAllocation(const void* ptr) const;
  // The physical pages under the allocated block at `ptr` in an address
  // range, to share them with another process (CUDA IPC of expandable
  // segments): `first_page` is the address of the first, `handles` one per
  // page in address order. NotFound if no allocated block starts at `ptr`,
  // FailedPrecondition if it is not in an address range.
  struct SharedPages {
    std::uintptr_t first_page = 0;
    std::size_t page_size = 0;
    std::vector<PhysicalPage> handles;
  };
  absl::StatusOr<SharedPages> PagesOfBlock(const void* ptr) const;
  // The segments of `pool` only (kDefaultPool: every segment, as GetSegments).
  std::vector<SegmentInfo> GetSegments(PoolId pool) const;
  // Blocks currently allocated (not pending), in allocation order.
  std::vector<BlockInfo> GetAllocatedBlocks() const;
  // The largest free cached block (PyTorch's cacheInfo), 0 if none.
  std::size_t LargestCachedBlock() const;
  EventHealth GetEventHealth() const;
  // Bytes of free cached blocks in private pools (for out-of-memory reports).
  std::int64_t PrivatePoolFreeBytes() const;

  // Hands over the survivors of a scope that is closing: blocks allocated
  // under `scope` (or under a scope nested in it) that are still allocated
  // or pending. They move to `parent` (if open), so an outer scope still
  // sees them.
  ScopeSurvivors CollectScope(ScopeId scope, ScopeId parent);

  // Verifies the invariants listed at the top of this file.
  absl::Status CheckInvariants() const;

  // Keeps the last `max_entries` events (alloc, free, segment, oom) in a
  // ring; 0 turns recording off and drops the history. A new capacity keeps
  // the entries recorded so far unless `clear`.
  void SetTraceCapacity(std::size_t max_entries, bool clear = true);
  // Actions not to record (bit i: TraceAction i), PyTorch's skip_actions.
  void SetTraceSkipActions(std::uint32_t mask);
  // Whether free_requested entries carry the context of the freeing code
  // (captured at the free) instead of the allocation's (PyTorch's
  // context="all").
  void SetTraceFreeContext(bool capture_at_free);
  // Replaces the installed context capture hook for this engine's
  // allocations, frees and cache releases (nullptr: back to the hook).
  // torchmem._C_cuda sets one while PyTorch's history asks for C++ or
  // TorchScript frames; other engines keep the plain Python stacks.
  void SetContextCaptureOverride(ContextCaptureFn hook);
  // See CacheMissHook (nullptr: none).
  void SetCacheMissHook(CacheMissHook hook) {
    cache_miss_hook_.store(hook, std::memory_order_release);
  }
  void SetTraceListener(TraceListener listener);
  std::vector<TraceEntry> GetTrace() const;
  // Records a kSnapshot entry (PyTorch's snapshot marker).
  void RecordSnapshotEvent();
  // Records a kAnnotate entry attaching `label` to the allocated block at
  // `ptr` (PyTorch's annotateMemory); NotFound if no allocated block starts
  // there. Nothing is recorded while tracing is off.
  absl::Status RecordAnnotation(const void* ptr, TraceLabel label);

  SizePolicy policy() const;

  // fork() support (see fork_safety.cc): hold / release the engine's lock
  // around fork() so the child never inherits it held by a thread that does
  // not exist there.
  void LockForFork() ABSL_EXCLUSIVE_LOCK_FUNCTION(mutex_) { mutex_.Lock(); }
  void UnlockAfterFork() ABSL_UNLOCK_FUNCTION(mutex_) { mutex_.Unlock(); }
  std::string DeviceName() const { return device_name_; }

 private:
  struct Route {
    PoolId pool;
    PoolFilter filter;
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

  // With `cache_missed`, a request that no cached block serves (PyTorch's
  // placement) sets it and returns nullptr instead of obtaining memory.
  absl::StatusOr<Block*> AllocateLocked(std::size_t size, StreamId stream,
                                        const Attribution& attribution, ContextId context,
                                        bool* cache_missed = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The private pool of the newest open route accepting `stream`, or nullptr.
  PrivatePool* RouteFor(StreamId stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Best fit among `lists`' blocks for `rounded`, within PyTorch's oversize
  // rules; removed from the index. nullptr if none.
  Block* TakeCachedBlock(FreeLists& lists, std::size_t rounded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // A new segment, or a cached block of a use_on_oom pool, after the
  // out-of-memory ladder (release oversize blocks, then everything
  // releasable) if the backend is out of memory.
  absl::StatusOr<Block*> NewSegment(std::size_t rounded_size, PoolKind pool, StreamId stream,
                                    PrivatePool* owner, ContextId context)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // A new segment from the backend, or from `owner`'s own source if it has one.
  absl::StatusOr<std::uintptr_t> BackendAllocate(std::size_t segment_size, StreamId stream,
                                                 PrivatePool* owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Gives a segment back to where BackendAllocate got it.
  absl::Status BackendRelease(std::uintptr_t address, std::size_t size, const PrivatePool* owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // --- virtual-memory placement (engine_vmm.cc) ---
  // A block of `rounded` bytes placed by page fit in the range of (owner,
  // stream, pool), its pages mapped; the range is reserved on first use.
  // When no page can be had: a use_on_oom pool lends a block (default pool
  // only), else the out-of-memory ladder runs.
  absl::StatusOr<Block*> AllocateInRange(std::size_t rounded, PoolKind pool, StreamId stream,
                                         PrivatePool* owner, ContextId context)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<Segment*> ReserveRange(StreamLists& lists, PoolKind pool, PrivatePool* owner,
                                        ContextId context) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Takes `size` bytes at `address` out of the free block `block`: returns
  // the carved block, unindexed; the rest stays free and indexed.
  Block* CarveBlock(Block* block, std::uintptr_t address, std::size_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The pages of a block that goes live / stops being live.
  absl::Status AcquirePages(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void ReleasePages(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // garbage_collection_threshold for virtual memory: past threshold x limit,
  // unmaps and frees cached pages of the default pool down to it.
  void CollectCachedPages() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Creates the engine's VmmSpaces on first use (one per pool kind: their
  // pages differ in size); an error if the backend has no virtual memory.
  absl::Status CreateVmmSpaces() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool HasVmmSpaces() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return vmm_[0] != nullptr; }
  // The space whose pages back the range (of its pool kind).
  VmmSpace& SpaceOf(const Segment& range) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return *vmm_[static_cast<int>(range.pool)];
  }
  // Bytes mapped in every range.
  std::int64_t MappedBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void OnPagesMapped(Segment& range, std::uintptr_t address, std::int64_t pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // range_bytes_ from the device's capacity now (a multiple of `page`).
  absl::Status SizeRanges(std::size_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Bytes of `segment` that hold memory: its size, or a range's mapped pages.
  std::int64_t HeldBytes(const Segment& segment) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void FillVmmStats(MemoryStats& stats) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Whether a free block counts in inactive_split: in a split segment, and
  // not a range's free tail (address space, not memory).
  static bool CountsAsInactiveSplit(const Block* block) {
    return block->state == BlockState::kFree && block->IsSplit() &&
           !(block->segment->vmm && block->next == nullptr);
  }
  Block* TakeFromUseOnOomPools(std::size_t rounded, PoolKind kind, StreamId stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The virtual-memory placement's TakeFromUseOnOomPools: a block of
  // `rounded` bytes lent by a use_on_oom pool, from its PyTorch segments or
  // from a place in its range whose pages are all mapped (no page is
  // created or stolen); nullptr if none has one.
  Block* LendFromUseOnOomPools(std::size_t rounded, PoolKind kind, StreamId stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Releases unsplit oversize free blocks of `lists` until `needed` bytes
  // came back (PyTorch's release_available_cached_blocks).
  bool ReleaseOversizeBlocks(FreeLists& lists, std::size_t needed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void CollectGarbage() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void SplitBlock(Block* block, std::size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void InsertMerged(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void AbsorbNeighbour(Block* block, Block* neighbour) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void MarkAllocated(Block* block, std::size_t requested, const Attribution& attribution,
                     ContextId context) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status FreeLocked(void* ptr, const std::size_t* requested_size, ContextId free_context)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void MakeReusable(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void RecordPendingEvents(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Returns the error of an event that could neither be queried nor waited
  // for (its block stays pending).
  absl::Status ProcessEventsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Records the events of blocks freed during a capture, now that none is.
  void RecordDeferredEvents() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void RetryUnrecordedEvents() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool CaptureUnderwayLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    // Either signal counts: PyTorch marks actual stream captures
    // (markCaptureBegin) and routes allocations to a graph's pool for the
    // capture's whole span (beginAllocateToPool); older versions only route.
    return marked_captures_ > 0 || !routes_.empty();
  }
  // An event's block is done waiting for it.
  void CompleteEvent(EventId event, Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Handles a failed query of `event` on `stream`: counts it, warns once,
  // waits for the event; OK when the event may count as complete.
  absl::Status WaitAfterQueryError(StreamId stream, EventId event, const absl::Status& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Counts a failed wait for an event of `stream` and says why its block
  // stays pending (with the backend's error code).
  absl::Status EventWaitFailure(StreamId stream, const absl::Status& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Waits for every pending event (of `only`'s blocks, if given); returns the
  // first failure (the blocks of that stream stay pending).
  absl::Status SynchronizeAllEvents(const PrivatePool* only = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Releases fully free segments: of the default pool (if `default_pool`) and
  // of released private pools (all of them, or only `only`); deletes
  // released pools left without segments.
  absl::Status ReleaseFreeSegments(bool default_pool, const PrivatePool* only = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status ReleaseSegment(Segment* segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void DeletePoolIfEmpty(PrivatePool* pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status EmptyCacheLocked(PoolId pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::StatusOr<PrivatePool*> FindPool(PoolId id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  PrivatePool* CreateOrIncrefPoolLocked(PoolId id, absl::Status* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // `user_metadata`: the entry's label; by default the process-wide one.
  void Trace(TraceAction action, std::uintptr_t address, std::size_t size, StreamId stream,
             ContextId context, const PrivatePool* pool, TraceLabel user_metadata = kNoTraceLabel)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool Tracing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return trace_ != nullptr || trace_listener_ != nullptr;
  }
  std::string OutOfMemoryMessage(std::size_t size, std::size_t rounded,
                                 const absl::Status& cause) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status UnknownPointerError(std::uintptr_t address) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  // The default pool's lists of `stream`; the stream of the previous call is
  // remembered, so a thread allocating on one stream finds them inline.
  StreamLists& ListsFor(StreamId stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (ABSL_PREDICT_TRUE(last_stream_ != nullptr && last_stream_->stream == stream)) {
      return *last_stream_;
    }
    return FindOrCreateLists(stream);
  }
  StreamLists& FindOrCreateLists(StreamId stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  StreamLists& PoolListsFor(PrivatePool* pool, StreamId stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Drops the lists of `segment` (which is being released) if no other
  // segment uses them.
  void ReleaseStreamListsIfUnused(Segment* segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Drops the lists of (owner, stream) if they hold no segment.
  void DropStreamListsIfEmpty(PrivatePool* owner, StreamId stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  Block* NewBlock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void DeleteBlock(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  TagCounters& CountersFor(TagId tag) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  ScopeBlocks* ScopeListFor(ScopeId scope) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  static void LinkToScope(Block* block, ScopeBlocks* list);
  static void UnlinkFromScope(Block* block);
  // Bytes a block contributes to inactive_split_bytes: free in a split
  // segment. Changes are collected during one allocation or one free and
  // applied as a net change by ApplyInactiveSplitChange, as PyTorch does
  // (free_block, alloc_found_block), so that inactive_split's allocated,
  // freed and peak counters are PyTorch's, not only its current value.
  void AddInactiveSplit(const Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void RemoveInactiveSplit(const Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // One operation changes one pool's blocks: `pool`.
  void ApplyInactiveSplitChange(PoolKind pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  static BlockInfo DescribeBlock(const Block& block);
  // A segment's fields without its blocks; DescribeSegment adds the blocks.
  // Not static: a VMM segment's mapped bytes come from the engine's page size.
  SegmentInfo DescribeSegmentHeader(const Segment& segment) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  SegmentInfo DescribeSegment(const Segment& segment) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  std::int64_t LargestFreeExtentLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const std::unique_ptr<Backend> backend_;
  const std::string device_name_;

  mutable Mutex mutex_;
  SizePolicy policy_ ABSL_GUARDED_BY(mutex_);
  Placement placement_ ABSL_GUARDED_BY(mutex_) = Placement::kPyTorch;
  // Indexed by PoolKind: the small pool's pages are the device's page
  // (2 MiB), the large pool's policy_.vmm_large_page_size (20 MiB).
  std::unique_ptr<VmmSpace> vmm_[kNumPools] ABSL_GUARDED_BY(mutex_);
  std::size_t range_bytes_ ABSL_GUARDED_BY(mutex_) = 0;  // address space per range
  std::int64_t reserved_address_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  std::int64_t peak_mapped_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  std::size_t memory_limit_ ABSL_GUARDED_BY(mutex_) = 0;
  double gc_threshold_ ABSL_GUARDED_BY(mutex_) = 0.0;
  // Lookups in the default pool's large lists, the clock of garbage
  // collection ages (counted only while a threshold is set).
  std::uint64_t gc_clock_ ABSL_GUARDED_BY(mutex_) = 0;
  MemoryStats stats_ ABSL_GUARDED_BY(mutex_);
  // The context segment_free entries carry while EmptyCache runs (else each
  // segment's allocation context).
  ContextId segment_free_context_ ABSL_GUARDED_BY(mutex_) = kNoContext;
  // Per pool: the inactive-split (blocks, bytes) change of the operation
  // under way, not yet in stats_ (see AddInactiveSplit). Zero between
  // operations.
  struct InactiveSplitChange {
    std::int64_t blocks = 0;
    std::int64_t bytes = 0;
  };
  std::array<InactiveSplitChange, kNumPools> inactive_split_change_ ABSL_GUARDED_BY(mutex_);
  std::uint64_t next_sequence_ ABSL_GUARDED_BY(mutex_) = 1;
  std::uint64_t next_segment_registration_ ABSL_GUARDED_BY(mutex_) = 1;
  std::unique_ptr<TraceRing> trace_ ABSL_GUARDED_BY(mutex_);
  std::uint32_t trace_skip_mask_ ABSL_GUARDED_BY(mutex_) = 0;
  std::atomic<bool> trace_free_context_{false};
  std::atomic<ContextCaptureFn> context_capture_override_{nullptr};
  std::atomic<CacheMissHook> cache_miss_hook_{nullptr};
  TraceListener trace_listener_ ABSL_GUARDED_BY(mutex_);

  // Private pools by id, open routes (newest last), stream captures marked.
  absl::flat_hash_map<PoolId, std::unique_ptr<PrivatePool>> private_pools_ ABSL_GUARDED_BY(mutex_);
  std::vector<Route> routes_ ABSL_GUARDED_BY(mutex_);
  int marked_captures_ ABSL_GUARDED_BY(mutex_) = 0;
  // Blocks freed during a capture with other-stream uses: pending, no event.
  std::vector<Block*> deferred_until_no_capture_ ABSL_GUARDED_BY(mutex_);

  // Every block of every segment, free or not, by address.
  absl::flat_hash_map<std::uintptr_t, Block*> blocks_ ABSL_GUARDED_BY(mutex_);
  // Segments by address (ordered, to find the segment around a pointer).
  absl::btree_map<std::uintptr_t, std::unique_ptr<Segment>> segments_ ABSL_GUARDED_BY(mutex_);
  // The default pool's free lists, by stream.
  absl::flat_hash_map<StreamId, std::unique_ptr<StreamLists>> streams_ ABSL_GUARDED_BY(mutex_);
  StreamLists* last_stream_ ABSL_GUARDED_BY(mutex_) = nullptr;

  // Events recorded for pending blocks, FIFO per stream that used them; a
  // stream's entry is erased when its queue empties.
  absl::flat_hash_map<StreamId, std::deque<PendingEvent>> pending_events_ ABSL_GUARDED_BY(mutex_);
  // Streams whose event could not be recorded yet (backend error): retried.
  std::vector<std::pair<StreamId, Block*>> unrecorded_events_ ABSL_GUARDED_BY(mutex_);
  std::size_t outstanding_events_ ABSL_GUARDED_BY(mutex_) = 0;
  std::int64_t event_query_errors_ ABSL_GUARDED_BY(mutex_) = 0;
  std::int64_t event_sync_errors_ ABSL_GUARDED_BY(mutex_) = 0;

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
