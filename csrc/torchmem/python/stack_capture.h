// Python stack capture: the engine's context hook, made cheap enough to leave on.
//
// While capture is requested (see torchmem/core/context_capture.h), the
// engine calls the hook on the allocating thread at every allocation, before
// it takes its lock. The hook records the calling thread's Python frames as
// (code object, instruction offset) pairs, interns the whole chain and returns
// its ContextId; Symbolize() turns an id into (filename, line, function name)
// later, when someone asks (a leak report, a snapshot). Nothing is formatted
// at allocation time.
//
// The GIL. PyTorch's Python bindings release the GIL around every op, so the
// hook usually runs without it. On CPython 3.10 to 3.13 the hook reads the
// thread's own interpreter frames directly, through the walker for that
// version's private frame layout (frame_walk.h): that chain belongs to the
// calling thread and is frozen while the thread runs C++ code, so no lock
// protects it and none is needed. In the steady state (a stack seen before)
// the hook takes no GIL at all: one shared lock on a table shard, one hash
// lookup. Only a stack with a code object never seen before takes the GIL
// (PyGILState_Ensure), once per code object for the life of the table, to
// take a strong reference. On other Python versions (or when built with
// TORCHMEM_STACK_CAPTURE_FORCE_GIL) the hook holds the GIL for the whole
// capture and uses public frame APIs.
//
// Invariants:
//   * Every code object that appears in an interned stack is kept alive by
//     exactly one strong reference held by the table (its "usage" count is
//     the number of frames of interned stacks that name it). A code pointer
//     is therefore never compared against, or symbolized from, freed memory,
//     and an address cannot be reused by another code object while any
//     interned stack names it.
//   * Context ids are never reused. After Prune() drops a stack, its id
//     symbolizes to an empty list, never to another stack.
//   * Identical stacks (same code objects and offsets, innermost first) get
//     the same id, whichever thread captured them.
//   * The hook never calls into the torchmem engine and never takes the GIL
//     while holding one of the table's locks (lock order: GIL, then table
//     locks). With a frame walker it allocates no Python objects and runs
//     no Python code; the public-API path creates frame objects, which may run the
//     garbage collector (and finalizers that free or allocate tensors), so
//     it walks the frames before touching the table.
//   * Nothing is captured once the interpreter is finalizing, or on threads
//     that have no Python thread state (PyTorch's C++ worker threads).
//   * fork() is safe: every table lock is taken around it, and the child
//     gets fresh locks (a DataLoader worker can allocate with capture on).
//
// The one GIL acquisition (first sight of a code object) happens before the
// engine takes its lock, as PyTorch's own capture does on every allocation.
// It could deadlock only if a thread holding the GIL waited for a lock the
// allocating thread holds; PyTorch calls its allocators outside its locks.
// In the steady state the hook never waits for the GIL.
#ifndef TORCHMEM_PYTHON_STACK_CAPTURE_H_
#define TORCHMEM_PYTHON_STACK_CAPTURE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "torchmem/core/types.h"

namespace torchmem::python {

// One symbolized Python frame.
struct Frame {
  std::string filename;
  int line = 0;
  std::string name;  // co_name, as in traceback and PyTorch's snapshots
};

struct StackCaptureStats {
  std::size_t interned_stacks = 0;          // stacks in the table now
  std::size_t distinct_frames = 0;          // distinct (code object, offset) pairs among them
  std::size_t code_objects_held = 0;        // strong references the table holds
  std::size_t bytes_used = 0;               // approximate heap used by the table
  std::uint64_t stacks_interned_total = 0;  // since the process started
  std::uint64_t stacks_pruned_total = 0;
  // Times the hook took the GIL to reference code objects it had never seen.
  // Constant in the steady state.
  std::uint64_t gil_acquisitions = 0;
  // New stacks interned by a thread that did not hold the GIL when the
  // engine called the hook (the normal case under torch ops).
  std::uint64_t interned_without_gil = 0;
  // True when the hook reads frames without the GIL (a frame walker for this
  // Python version, see frame_walk.h).
  bool gil_free_walk = false;
};

// Installs the hook in the engine. Capture still runs only while requested.
void InstallStackCapture();

// A balanced, checked front for Request/ReleaseContextCapture: the Python
// layer goes through these, so a stray release cannot drive the engine's
// request count negative (which would turn capture on for good).
void RequestStackCapture();
absl::Status ReleaseStackCapture();

// The hook itself: the calling thread's interned Python stack, or kNoContext.
// Callable with or without the GIL.
ContextId CapturePythonStack();

// The frames of an interned stack, innermost first; empty for kNoContext and
// for unknown or pruned ids. Requires the GIL.
std::vector<Frame> Symbolize(ContextId id);

StackCaptureStats GetStackCaptureStats();

// Pruning keeps the table bounded in long runs. The exact protocol, for
// callers that cannot stop other threads from allocating meanwhile:
//   epoch = BeginPruneEpoch();
//   live  = <context ids of every allocated block, listed now>;
//   Prune(live, epoch);
// Kept: stacks in `live`; stacks captured after BeginPruneEpoch(); and the
// stack each thread captured last when the epoch began (its block may not
// be listed by the engine yet). Everything else is dropped, so no block
// allocated before `live` was listed loses its stack. Without an epoch,
// Prune begins one itself, which is exact only if no block was recorded
// between listing `live` and the call. At most 8 begun epochs are
// remembered; an older one prunes without its in-flight ids.
std::uint64_t BeginPruneEpoch();

// Drops the interned stacks the protocol above does not keep and releases
// the code objects no remaining stack names. Returns the number of stacks
// dropped. Requires the GIL.
std::size_t Prune(absl::Span<const ContextId> live_ids,
                  std::optional<std::uint64_t> epoch = std::nullopt);

}  // namespace torchmem::python

#endif  // TORCHMEM_PYTHON_STACK_CAPTURE_H_
