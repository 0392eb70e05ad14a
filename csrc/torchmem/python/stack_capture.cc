#include "torchmem/python/stack_capture.h"

#include <Python.h>
#include <frameobject.h>

#include <pthread.h>

#include <atomic>
#include <bit>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <shared_mutex>
#include <utility>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "torchmem/core/context_capture.h"
#include "torchmem/python/frame_walk.h"
#include "torchmem/python/python_compat.h"

namespace torchmem::python {
namespace {

// Deeper stacks keep their innermost kMaxFrames frames (the ones that say
// where the allocation happened) and are marked truncated. The hook keeps
// them in a stack array, so this bounds the hook's stack use (4 KiB).
constexpr int kMaxFrames = 256;
// Shards spread the table's shared locks (and inserts) over cache lines.
constexpr int kNumShards = 16;
// Epochs begun (BeginPruneEpoch) whose in-flight ids are kept for Prune.
constexpr std::size_t kMaxOpenEpochs = 8;

// One captured frame (code object, byte offset of its instruction), as the
// frame walkers write it. Trivially constructible so the hook's frame array
// costs nothing to declare.
using RawFrame = TorchmemRawFrame;

inline bool SameFrames(absl::Span<const RawFrame> a, absl::Span<const RawFrame> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].code != b[i].code || a[i].offset != b[i].offset) return false;
  }
  return true;
}

// FxHash-style step: one multiply per frame keeps the hook cheap; the final
// mix spreads the bits because absl's tables use both the low 7 bits and
// the rest of the hash.
constexpr std::uint64_t kHashSeed = 0x243F6A8885A308D3ULL;
inline std::uint64_t HashStep(std::uint64_t h, const RawFrame& frame) {
  const std::uint64_t value =
      reinterpret_cast<std::uintptr_t>(frame.code) ^
      (static_cast<std::uint64_t>(static_cast<std::uint32_t>(frame.offset)) << 44);
  return (std::rotl(h, 5) ^ value) * 0x9E3779B97F4A7C15ULL;
}
inline std::uint64_t HashFinish(std::uint64_t h, int count, bool truncated) {
  h ^= static_cast<std::uint64_t>(count) << 1 | static_cast<std::uint64_t>(truncated);
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDULL;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ULL;
  h ^= h >> 33;
  return h;
}

struct InternedStack {
  std::uint64_t hash = 0;
  ContextId id = kNoContext;
  bool truncated = false;
  // The prune epoch in which the stack was last captured (see Prune).
  // Written under its shard's shared lock by any capturing thread.
  std::atomic<std::uint64_t> last_used_epoch{0};
  std::vector<RawFrame> frames;  // innermost first
};

// Lookup key: a captured stack not yet (or already) interned.
struct StackKey {
  std::uint64_t hash;
  absl::Span<const RawFrame> frames;
  bool truncated;
};

struct StackHash {
  using is_transparent = void;
  std::size_t operator()(const StackKey& key) const { return key.hash; }
  std::size_t operator()(const InternedStack* stack) const { return stack->hash; }
};

struct StackEq {
  using is_transparent = void;
  static bool Equal(std::uint64_t hash_a, absl::Span<const RawFrame> a, bool truncated_a,
                    const InternedStack* b) {
    return hash_a == b->hash && truncated_a == b->truncated && SameFrames(a, b->frames);
  }
  bool operator()(const InternedStack* a, const InternedStack* b) const {
    return a == b || Equal(a->hash, a->frames, a->truncated, b);
  }
  bool operator()(const StackKey& a, const InternedStack* b) const {
    return Equal(a.hash, a.frames, a.truncated, b);
  }
  bool operator()(const InternedStack* a, const StackKey& b) const { return (*this)(b, a); }
};

struct alignas(64) Shard {
  std::shared_mutex mutex;
  absl::flat_hash_set<InternedStack*, StackHash, StackEq> stacks;  // owned by by_id_
};

// Counts of code-object occurrences in a captured stack, deduplicated (a
// recursive function appears many times but is referenced once).
using CodeCounts = absl::InlinedVector<std::pair<PyCodeObject*, std::int64_t>, 8>;

void AddCode(CodeCounts& counts, PyCodeObject* code) {
  for (auto& [c, n] : counts) {
    if (c == code) {
      ++n;
      return;
    }
  }
  counts.emplace_back(code, 1);
}

// Where a thread publishes the id it captured last. An id stays here until
// the thread's next capture, which comes after the engine recorded the block
// of this one, so "ids in the slots" covers every block that has a context
// but is not yet listed by the engine (see BeginEpoch).
struct ThreadSlot {
  std::atomic<ContextId> last{kNoContext};
  ThreadSlot();
  ~ThreadSlot();
};

// An interned id, and the prune epoch it was stamped with.
struct Interned {
  ContextId id = kNoContext;
  std::uint64_t epoch = 0;
};

// The interning table. Locks: a shard's shared_mutex (lookups shared,
// inserts and prunes exclusive), then ids_mutex_; codes_mutex_,
// slots_mutex_ and prune_mutex_ are taken alone. The GIL, when needed, is
// taken before any of them.
class StackTable {
 public:
  Interned Intern(const RawFrame* frames, int count, bool truncated, std::uint64_t hash,
                  bool holds_gil) {
    const StackKey key{hash, absl::MakeConstSpan(frames, count), truncated};
    Shard& shard = ShardFor(hash);
    {
      std::shared_lock lock(shard.mutex);
      auto it = shard.stacks.find(key);
      if (it != shard.stacks.end()) return Interned{(*it)->id, Touch(**it)};
    }
    return InternNew(key, holds_gil);
  }

  std::uint64_t CurrentEpoch() const { return epoch_.load(std::memory_order_seq_cst); }

  // fork(): the child has only the forking thread, so a table lock held by
  // another thread at that moment would never be released there (a
  // DataLoader worker that allocates would hang). The prepare handler takes
  // every lock, in the order the table nests them (shards, then ids; the
  // others are leaves), so the child inherits consistent tables; the child
  // re-creates the locks rather than unlocking them (glibc's rwlock unlock
  // checks the writer's thread id, which fork changed). Holders never wait
  // for anything while holding a table lock, so the prepare handler cannot
  // deadlock.
  void LockForFork() {
    for (Shard& shard : shards_) shard.mutex.lock();
    ids_mutex_.lock();
    codes_mutex_.lock();
    slots_mutex_.lock();
    prune_mutex_.lock();
  }
  void UnlockAfterForkInParent() {
    prune_mutex_.unlock();
    slots_mutex_.unlock();
    codes_mutex_.unlock();
    ids_mutex_.unlock();
    for (Shard& shard : shards_) shard.mutex.unlock();
  }
  void ResetAfterForkInChild() {
    // Reusing the storage of the (locked) mutexes: no thread can hold or
    // wait on them in the child, and they own no resources.
    for (Shard& shard : shards_) new (&shard.mutex) std::shared_mutex;
    new (&ids_mutex_) std::mutex;
    new (&codes_mutex_) std::mutex;
    new (&slots_mutex_) std::mutex;
    new (&prune_mutex_) std::mutex;
    // The other threads are gone; none of their captures is in flight.
    slots_.clear();
    in_flight_by_epoch_.clear();
  }

  void RegisterSlot(ThreadSlot* slot) {
    std::lock_guard<std::mutex> lock(slots_mutex_);
    slots_.insert(slot);
  }
  void UnregisterSlot(ThreadSlot* slot) {
    std::lock_guard<std::mutex> lock(slots_mutex_);
    slots_.erase(slot);
  }

  std::vector<Frame> Symbolize(ContextId id) {
    std::vector<RawFrame> frames;
    bool truncated = false;
    {
      std::lock_guard<std::mutex> lock(ids_mutex_);
      auto it = by_id_.find(id);
      if (it == by_id_.end()) return {};
      frames = it->second->frames;
      truncated = it->second->truncated;
      // Our own references for the rest of the call: the stack's are the
      // table's, and a Prune on another thread may drop them once the lock
      // is released.
      for (const RawFrame& frame : frames) Py_INCREF(frame.code);
    }
    std::vector<Frame> out;
    out.reserve(frames.size() + (truncated ? 1 : 0));
    for (const RawFrame& frame : frames) {
      PyCodeObject* code = frame.code;
      out.push_back(Frame{Utf8(code->co_filename), PyCode_Addr2Line(code, frame.offset),
                          Utf8(code->co_name)});
    }
    // A marker in the form torchmem._stack uses for folded frames.
    if (truncated) out.push_back(Frame{"...", 0, "older frames not captured"});
    // After every lock is released: a last reference may deallocate a code
    // object, whose weakref callbacks run Python code.
    for (const RawFrame& frame : frames) Py_DECREF(frame.code);
    return out;
  }

  // The frames of `id` with one new reference to each code object (for
  // ResolveContextFrames). Requires the GIL (Py_INCREF).
  bool CopyFrames(ContextId id, std::vector<ContextFrame>* out) {
    std::lock_guard<std::mutex> lock(ids_mutex_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return false;
    out->clear();
    out->reserve(it->second->frames.size());
    for (const RawFrame& frame : it->second->frames) {
      Py_INCREF(frame.code);
      out->push_back(ContextFrame{frame.code, frame.offset});
    }
    return true;
  }

  StackCaptureStats Stats() {
    StackCaptureStats stats;
    std::size_t bytes = sizeof(StackTable);
    for (Shard& shard : shards_) {
      std::shared_lock lock(shard.mutex);
      bytes += shard.stacks.capacity() * (sizeof(InternedStack*) + 1);
    }
    {
      std::lock_guard<std::mutex> lock(ids_mutex_);
      stats.interned_stacks = by_id_.size();
      bytes += by_id_.capacity() * (sizeof(decltype(by_id_)::value_type) + 1);
      absl::flat_hash_set<std::pair<const void*, int>> distinct;
      for (const auto& [id, stack] : by_id_) {
        bytes += sizeof(InternedStack) + stack->frames.capacity() * sizeof(RawFrame);
        for (const RawFrame& frame : stack->frames) distinct.emplace(frame.code, frame.offset);
      }
      stats.distinct_frames = distinct.size();
    }
    {
      std::lock_guard<std::mutex> lock(codes_mutex_);
      stats.code_objects_held = code_usage_.size();
      bytes += code_usage_.capacity() * (sizeof(decltype(code_usage_)::value_type) + 1);
    }
    stats.bytes_used = bytes;
    stats.stacks_interned_total = interned_total_.load(std::memory_order_relaxed);
    stats.stacks_pruned_total = pruned_total_.load(std::memory_order_relaxed);
    stats.gil_acquisitions = gil_acquisitions_.load(std::memory_order_relaxed);
    stats.interned_without_gil = interned_without_gil_.load(std::memory_order_relaxed);
    stats.gil_free_walk = TORCHMEM_GIL_FREE_WALK;
    return stats;
  }

  // Starts epoch E and records the ids captured but possibly not yet
  // recorded by an engine. With the capture side (CapturePythonStack), for a
  // block whose stack was captured at time h and recorded by its engine at
  // r, and a caller that lists live blocks at L after BeginEpoch (at B):
  //   r < L        -> the block is in the caller's live list;
  //   h < B < r    -> its id was in its thread's slot at B (the thread has
  //                   not captured again before r), so it is in in_flight;
  //   B < h        -> its stack is stamped with epoch >= E.
  // The seq_cst pair (epoch bump then slot reads here; slot store then
  // epoch re-read there) ensures a capture racing with B lands in one of
  // the last two cases.
  std::uint64_t BeginEpoch() {
    const std::uint64_t epoch = epoch_.fetch_add(1, std::memory_order_seq_cst) + 1;
    absl::flat_hash_set<ContextId> in_flight;
    {
      std::lock_guard<std::mutex> lock(slots_mutex_);
      for (const ThreadSlot* slot : slots_) {
        const ContextId id = slot->last.load(std::memory_order_seq_cst);
        if (id != kNoContext) in_flight.insert(id);
      }
    }
    std::lock_guard<std::mutex> lock(prune_mutex_);
    in_flight_by_epoch_[epoch] = std::move(in_flight);
    // Epochs begun but never pruned must not accumulate.
    while (in_flight_by_epoch_.size() > kMaxOpenEpochs) {
      in_flight_by_epoch_.erase(in_flight_by_epoch_.begin());
    }
    return epoch;
  }

  std::size_t Prune(absl::Span<const ContextId> live_ids, std::optional<std::uint64_t> epoch) {
    const std::uint64_t keep_used_since = epoch.has_value() ? *epoch : BeginEpoch();
    absl::flat_hash_set<ContextId> live(live_ids.begin(), live_ids.end());
    {
      std::lock_guard<std::mutex> lock(prune_mutex_);
      auto it = in_flight_by_epoch_.find(keep_used_since);
      if (it != in_flight_by_epoch_.end()) {
        live.insert(it->second.begin(), it->second.end());
        in_flight_by_epoch_.erase(it);
      }
    }
    std::vector<std::unique_ptr<InternedStack>> dropped;
    for (Shard& shard : shards_) {
      // Exclusive: a capture that stamped a stack under the shared lock
      // before this point is visible here, and one after it either finds
      // the stack kept or interns a fresh one.
      std::unique_lock lock(shard.mutex);
      for (auto it = shard.stacks.begin(); it != shard.stacks.end();) {
        InternedStack* stack = *it;
        if (live.contains(stack->id) ||
            stack->last_used_epoch.load(std::memory_order_relaxed) >= keep_used_since) {
          ++it;
          continue;
        }
        shard.stacks.erase(it++);
        std::lock_guard<std::mutex> ids_lock(ids_mutex_);
        auto owner = by_id_.find(stack->id);
        dropped.push_back(std::move(owner->second));
        by_id_.erase(owner);
      }
    }
    std::vector<PyCodeObject*> released;
    {
      std::lock_guard<std::mutex> lock(codes_mutex_);
      for (const auto& stack : dropped) {
        for (const RawFrame& frame : stack->frames) {
          auto it = code_usage_.find(frame.code);
          if (it != code_usage_.end()) --it->second;
        }
      }
      for (auto it = code_usage_.begin(); it != code_usage_.end();) {
        if (it->second > 0) {
          ++it;
          continue;
        }
        released.push_back(it->first);
        code_usage_.erase(it++);
      }
    }
    pruned_total_.fetch_add(dropped.size(), std::memory_order_relaxed);
    // With the GIL (the caller's) and without our locks: deallocating a code
    // object may run weakref callbacks, which may allocate and so capture.
    // A code object still on some thread's frame chain survives this (the
    // frame holds it); that thread re-references it if it interns it again.
    for (PyCodeObject* code : released) Py_DECREF(code);
    return dropped.size();
  }

 private:
  Shard& ShardFor(std::uint64_t hash) { return shards_[hash >> 60 & (kNumShards - 1)]; }

  // Stamps the current epoch on a stack (under its shard's lock); returns it.
  std::uint64_t Touch(InternedStack& stack) {
    const std::uint64_t epoch = epoch_.load(std::memory_order_relaxed);
    // Read first: stacks hit in a loop stay shared in every core's cache.
    if (stack.last_used_epoch.load(std::memory_order_relaxed) < epoch) {
      stack.last_used_epoch.store(epoch, std::memory_order_relaxed);
    }
    return epoch;
  }

  // The slow path: a stack not in the table. Every code object it names is
  // referenced (pinned) before the stack becomes visible, so a lookup that
  // finds the stack never needs the GIL.
  Interned InternNew(const StackKey& key, bool holds_gil) {
    // 1. Pin the code objects the table already holds, so a concurrent
    //    Prune cannot release them; collect the others.
    CodeCounts unknown;
    {
      std::lock_guard<std::mutex> lock(codes_mutex_);
      for (const RawFrame& frame : key.frames) {
        auto it = code_usage_.find(frame.code);
        if (it != code_usage_.end()) {
          ++it->second;
        } else {
          AddCode(unknown, frame.code);
        }
      }
    }
    // 2. Reference the new ones. They are alive now (this thread's frames
    //    hold them) but may not be once it returns to Python, so the table
    //    takes its own reference, which needs the GIL. This is the only
    //    place the hook may take the GIL; no table lock is held here.
    if (!unknown.empty()) {
      if (!holds_gil && InterpreterGone()) {
        // PyGILState_Ensure would end this thread during finalization.
        UnpinKnown(key.frames, unknown);
        return Interned{};
      }
      PyGILState_STATE gil{};
      if (!holds_gil) {
        gil = PyGILState_Ensure();
        gil_acquisitions_.fetch_add(1, std::memory_order_relaxed);
      }
      {
        std::lock_guard<std::mutex> lock(codes_mutex_);
        for (const auto& [code, count] : unknown) {
          auto [it, inserted] = code_usage_.try_emplace(code, 0);
          // Another thread may have referenced it since step 1.
          if (inserted) Py_INCREF(code);
          it->second += count;
        }
      }
      if (!holds_gil) PyGILState_Release(gil);
    }
    // 3. Publish, unless another thread published the same stack meanwhile.
    auto stack = std::make_unique<InternedStack>();
    stack->hash = key.hash;
    stack->truncated = key.truncated;
    stack->frames.assign(key.frames.begin(), key.frames.end());
    Interned result;
    bool lost_race = false;
    {
      Shard& shard = ShardFor(key.hash);
      std::unique_lock lock(shard.mutex);
      auto it = shard.stacks.find(key);
      if (it != shard.stacks.end()) {
        result = Interned{(*it)->id, Touch(**it)};
        lost_race = true;
      } else {
        const ContextId id = next_id_.fetch_add(1, std::memory_order_relaxed);
        stack->id = id;
        result = Interned{id, Touch(*stack)};
        shard.stacks.insert(stack.get());
        std::lock_guard<std::mutex> ids_lock(ids_mutex_);
        by_id_.emplace(id, std::move(stack));
      }
    }
    if (lost_race) {
      // The winner pinned the same code objects; drop our pins.
      std::lock_guard<std::mutex> lock(codes_mutex_);
      for (const RawFrame& frame : key.frames) --code_usage_[frame.code];
    } else {
      interned_total_.fetch_add(1, std::memory_order_relaxed);
      if (!holds_gil) interned_without_gil_.fetch_add(1, std::memory_order_relaxed);
    }
    return result;
  }

  void UnpinKnown(absl::Span<const RawFrame> frames, const CodeCounts& unknown) {
    std::lock_guard<std::mutex> lock(codes_mutex_);
    for (const RawFrame& frame : frames) {
      bool was_unknown = false;
      for (const auto& [code, count] : unknown) was_unknown |= code == frame.code;
      if (!was_unknown) --code_usage_[frame.code];
    }
  }

  static std::string Utf8(PyObject* text) {
    if (text == nullptr || !PyUnicode_Check(text)) return "?";
    const char* utf8 = PyUnicode_AsUTF8(text);
    if (utf8 == nullptr) {  // e.g. lone surrogates in a file name
      PyErr_Clear();
      return "?";
    }
    return utf8;
  }

  Shard shards_[kNumShards];
  std::atomic<std::uint64_t> epoch_{1};
  std::atomic<ContextId> next_id_{kNoContext + 1};  // ids are never reused

  std::mutex slots_mutex_;
  absl::flat_hash_set<ThreadSlot*> slots_;  // one per thread that captured

  // Per begun epoch: the ids in flight when it began (see BeginEpoch).
  std::mutex prune_mutex_;
  absl::btree_map<std::uint64_t, absl::flat_hash_set<ContextId>> in_flight_by_epoch_;

  std::mutex ids_mutex_;
  absl::flat_hash_map<ContextId, std::unique_ptr<InternedStack>> by_id_;  // owns the stacks

  // Code object -> number of frames of interned stacks (plus in-flight
  // pins) naming it. Every key carries one strong reference of ours.
  std::mutex codes_mutex_;
  absl::flat_hash_map<PyCodeObject*, std::int64_t> code_usage_;

  std::atomic<std::uint64_t> interned_total_{0};
  std::atomic<std::uint64_t> pruned_total_{0};
  std::atomic<std::uint64_t> gil_acquisitions_{0};
  std::atomic<std::uint64_t> interned_without_gil_{0};
};

// Never destroyed: it holds Python references that must not be released
// after the interpreter is gone, and the hook may run during exit.
StackTable& Table() {
  static StackTable* table = new StackTable;
  return *table;
}

ThreadSlot::ThreadSlot() { Table().RegisterSlot(this); }
ThreadSlot::~ThreadSlot() { Table().UnregisterSlot(this); }

// Only touched after the thread is known to have a Python thread state,
// i.e. never from a thread-exit destructor (Python deletes a thread's state
// before its thread_local objects are destroyed).
thread_local ThreadSlot t_slot;

// Interns the captured stack and publishes its id in this thread's slot so
// that a prune starting now keeps it (see StackTable::BeginEpoch).
ContextId InternAndPublish(const RawFrame* frames, int count, bool truncated, std::uint64_t hash,
                           bool holds_gil) {
  StackTable& table = Table();
  for (;;) {
    const Interned interned = table.Intern(frames, count, truncated, hash, holds_gil);
    if (interned.id == kNoContext) return kNoContext;
    t_slot.last.store(interned.id, std::memory_order_seq_cst);
    // No epoch began since the stamp: a later BeginEpoch sees the slot.
    // Otherwise stamp again (or re-intern, if a prune dropped the stack).
    if (table.CurrentEpoch() == interned.epoch) return interned.id;
  }
}

std::mutex g_requests_mutex;
int g_python_requests = 0;  // guarded by g_requests_mutex

void PrepareFork() {
  g_requests_mutex.lock();
  Table().LockForFork();
}
void AfterForkInParent() {
  Table().UnlockAfterForkInParent();
  g_requests_mutex.unlock();
}
void AfterForkInChild() {
  Table().ResetAfterForkInChild();
  // The forking thread lives on in the child; its captures still count.
  Table().RegisterSlot(&t_slot);
  new (&g_requests_mutex) std::mutex;
}

#if !TORCHMEM_GIL_FREE_WALK
// Byte offset of the frame's last instruction, as PyCode_Addr2Line takes it.
int LastInstructionBytes(PyFrameObject* frame) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(frame);
#elif PY_VERSION_HEX >= 0x030A0000
  return frame->f_lasti * static_cast<int>(sizeof(_Py_CODEUNIT));  // 3.10 counts code units
#else
  return frame->f_lasti;
#endif
}
#endif

}  // namespace

ContextId CapturePythonStack() {
  if (InterpreterGone()) return kNoContext;
  // Works without the GIL: a thread-local lookup. Null on threads Python
  // never ran on (PyTorch's worker pools): they have no Python stack.
  PyThreadState* tstate = PyGILState_GetThisThreadState();
  if (tstate == nullptr) return kNoContext;

  RawFrame frames[kMaxFrames];
  int count = 0;
  bool truncated = false;
  std::uint64_t hash = kHashSeed;
#if TORCHMEM_GIL_FREE_WALK
  // Without the GIL: the version's walker reads this thread's own frames
  // (see frame_walk.h for why that needs no lock).
  int truncated_flag = 0;
  count = TorchmemWalkOwnFrames(tstate, frames, kMaxFrames, &truncated_flag);
  if (count == 0) return kNoContext;
  truncated = truncated_flag != 0;
  for (int i = 0; i < count; ++i) hash = HashStep(hash, frames[i]);
  // Whether this thread holds the GIL (an atomic read of the current
  // thread state): torch ops release it, plain Python paths may not.
  const bool holds_gil = _PyThreadState_UncheckedGet() == tstate;
  return InternAndPublish(frames, count, truncated, HashFinish(hash, count, truncated), holds_gil);
#else
  // Public API: frame objects are created on demand, so the GIL is needed
  // for the whole walk (PyTorch's own capture pays this on every call).
  const PyGILState_STATE gil = PyGILState_Ensure();
  PyFrameObject* frame = PyThreadState_GetFrame(tstate);
  while (frame != nullptr) {
    if (count == kMaxFrames) {
      truncated = true;
      Py_DECREF(frame);
      break;
    }
    PyCodeObject* code = PyFrame_GetCode(frame);
    frames[count] = RawFrame{code, LastInstructionBytes(frame)};
    // Borrowed from here on: the running frame keeps the code alive while
    // we hold the GIL, and the table takes its own reference when interning.
    Py_DECREF(code);
    hash = HashStep(hash, frames[count]);
    ++count;
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  const ContextId id =
      count == 0 ? kNoContext
                 : InternAndPublish(frames, count, truncated, HashFinish(hash, count, truncated),
                                    /*holds_gil=*/true);
  PyGILState_Release(gil);
  return id;
#endif
}

// ResolveContextFrames' resolver: torchmem._C_cuda turns the frames into
// PyTorch's CapturedTraceback for snapshots (torch/cuda/traceback_unwinder.h).
static bool CopyContextFrames(ContextId id, std::vector<ContextFrame>* out) {
  id = BaseContext(id);
  if (id == kNoContext || InterpreterGone()) return false;
  return Table().CopyFrames(id, out);
}

void InstallStackCapture() {
  static std::once_flag fork_handlers;
  std::call_once(fork_handlers,
                 [] { pthread_atfork(&PrepareFork, &AfterForkInParent, &AfterForkInChild); });
  SetContextCaptureHook(&CapturePythonStack);
  SetContextFramesResolver(&CopyContextFrames);
}

void RequestStackCapture() {
  std::lock_guard<std::mutex> lock(g_requests_mutex);
  ++g_python_requests;
  RequestContextCapture();
}

absl::Status ReleaseStackCapture() {
  std::lock_guard<std::mutex> lock(g_requests_mutex);
  if (g_python_requests == 0) {
    return absl::FailedPreconditionError(
        "torchmem: release_stack_capture() without a matching request_stack_capture(); use "
        "torchmem._stack.capturing() or record_history() to keep requests balanced");
  }
  --g_python_requests;
  ReleaseContextCapture();
  return absl::OkStatus();
}

std::vector<Frame> Symbolize(ContextId id) {
  id = BaseContext(id);  // a context with C++ frames: its Python stack
  if (id == kNoContext) return {};
  return Table().Symbolize(id);
}

StackCaptureStats GetStackCaptureStats() { return Table().Stats(); }

std::uint64_t BeginPruneEpoch() { return Table().BeginEpoch(); }

std::size_t Prune(absl::Span<const ContextId> live_ids, std::optional<std::uint64_t> epoch) {
  // A live context with C++ frames keeps its Python stack alive.
  std::vector<ContextId> base_ids(live_ids.begin(), live_ids.end());
  for (ContextId& id : base_ids) id = BaseContext(id);
  return Table().Prune(base_ids, epoch);
}

}  // namespace torchmem::python
