#include "torchmem/torch/cuda/history_contexts.h"

#include <atomic>
#include <cstddef>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/profiler/unwind/unwind.h>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "torchmem/core/context_capture.h"
#include "torchmem/torch/cuda/cuda_fork_locks.h"
#include "torchmem/torch/cuda/traceback_contexts.h"

namespace torchmem::torch_glue {
namespace {

// CapturedTraceback keeps its C++ frames private and has no reader short of
// symbolizing them, which loads every library's symbols (seconds, the first
// time). An explicit instantiation may name a private member
// ([temp.spec.general]: access is not checked there), and the compiler checks
// the member's type against each torch this is built with.
using CppFramesPointer = std::vector<void*> torch::CapturedTraceback::*;
CppFramesPointer CppFramesMember();
template <CppFramesPointer kMember>
struct CppFramesAccess {
  friend CppFramesPointer CppFramesMember() { return kMember; }
};
template struct CppFramesAccess<&torch::CapturedTraceback::cpp_frames_>;

// A TorchScript frame as PyTorch's symbolizer names it: file and source range.
struct ScriptFrame {
  std::string filename;
  const void* source = nullptr;
  std::size_t start = 0;
  std::size_t end = 0;

  bool operator==(const ScriptFrame&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const ScriptFrame& frame) {
    return H::combine(std::move(h), frame.filename, frame.source, frame.start, frame.end);
  }
};

// What makes two allocations' full contexts the same.
struct Key {
  ContextId python_stack = kNoContext;
  std::vector<void*> cpp;           // return addresses, innermost first
  std::vector<ScriptFrame> script;  // TorchScript frames, when no C++ ones

  bool operator==(const Key&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const Key& key) {
    return H::combine(std::move(h), key.python_stack, key.cpp, key.script);
  }
};

struct Derived {
  ContextId python_stack = kNoContext;
  std::shared_ptr<c10::GatheredContext> context;
};

class DerivedTable {
 public:
  // The id of `key`'s context; gathers it (with `cpp` frames) on first sight.
  ContextId Intern(Key key, bool cpp) {
    {
      std::shared_lock<std::shared_mutex> lock(mutex_);
      if (auto it = ids_.find(key); it != ids_.end()) return it->second;
    }
    // Gathered without our lock: it takes the GIL, which a thread holding it
    // may need while waiting for us.
    std::shared_ptr<c10::GatheredContext> context = GatherWithPythonStack(key.python_stack, cpp);
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto [it, inserted] = ids_.try_emplace(std::move(key), kNoContext);
    if (inserted) {
      it->second = kDerivedContextBit | next_id_++;
      by_id_.emplace(it->second, Derived{it->first.python_stack, std::move(context)});
    }
    return it->second;
  }

  ContextId Base(ContextId id) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = by_id_.find(id);
    return it == by_id_.end() ? kNoContext : it->second.python_stack;
  }

  void LockForFork() { mutex_.lock(); }
  void UnlockAfterFork() { mutex_.unlock(); }
  // Only in a forked child, whose one thread holds the lock (taken before
  // fork by the parent's forking thread): nothing else can use it.
  void ResetLockInChild() { new (&mutex_) std::shared_mutex(); }

  std::shared_ptr<c10::GatheredContext> Context(ContextId id) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : it->second.context;
  }

 private:
  mutable std::shared_mutex mutex_;
  absl::flat_hash_map<Key, ContextId> ids_;
  absl::flat_hash_map<ContextId, Derived> by_id_;
  ContextId next_id_ = 1;
};

DerivedTable& Table() {
  static auto* table = new DerivedTable;  // leaked: engines may stamp at exit
  return *table;
}

ContextId BaseOfDerived(ContextId id) { return Table().Base(id); }

std::atomic<bool> g_cpp_frames{false};

}  // namespace

bool RecorderGathersCpp(c10::cuda::CUDACachingAllocator::CreateContextFn recorder) {
  if (recorder == nullptr) return false;
  std::shared_ptr<c10::GatheredContext> probe = recorder();
  auto* traceback = dynamic_cast<torch::CapturedTraceback*>(probe.get());
  return traceback != nullptr && !(traceback->*CppFramesMember()).empty();
}

void SetHistoryCppFrames(bool cpp) {
  static std::once_flag resolver;
  std::call_once(resolver, [] { SetContextBaseResolver(&BaseOfDerived); });
  g_cpp_frames.store(cpp, std::memory_order_relaxed);
}

ContextId CaptureWithTorchFrames() {
  Key key;
  key.python_stack = CaptureBaseContext();
  const bool cpp = g_cpp_frames.load(std::memory_order_relaxed);
  if (cpp) {
    key.cpp = torch::unwind::unwind();
  } else {
    std::vector<torch::jit::StackEntry> script = torch::jit::currentCallstack();
    if (script.empty())
      return key.python_stack;  // outside TorchScript: the Python stack says it all
    key.script.reserve(script.size());
    for (const torch::jit::StackEntry& entry : script) {
      key.script.push_back(ScriptFrame{entry.filename, entry.range.source().get(),
                                       entry.range.start(), entry.range.end()});
    }
  }
  return Table().Intern(std::move(key), cpp);
}

std::shared_ptr<c10::GatheredContext> DerivedContext(ContextId id) { return Table().Context(id); }

void LockHistoryContextsForFork() { Table().LockForFork(); }

void UnlockHistoryContextsAfterFork() { Table().UnlockAfterFork(); }

void ResetHistoryContextsLockInChild() { Table().ResetLockInChild(); }

}  // namespace torchmem::torch_glue
