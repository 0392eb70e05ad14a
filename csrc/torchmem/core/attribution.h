// Attribution: which tag and which leak-check scope an allocation belongs to.
//
// Each thread has a stack of tags and a stack of scopes; the innermost of
// each is stamped on every block the thread allocates. Tags are interned
// names (TagRegistry); scopes get process-wide ids that are never reused.
//
// Threads that PyTorch runs on the user's behalf (autograd's backward
// workers) have empty stacks of their own; for them an AttributionProvider
// installed by the torch glue reads the state PyTorch propagated from the
// thread that started the work. When no tag or scope is open anywhere in the
// process, CurrentAttribution() costs one relaxed atomic load.
//
// Rules (violations return errors and change nothing):
//   - PopTag/CloseScope take the innermost entry of the calling thread only;
//   - scope parents are fixed when the scope opens (the scope below it on
//     the same thread's stack).
#ifndef TORCHMEM_CORE_ATTRIBUTION_H_
#define TORCHMEM_CORE_ATTRIBUTION_H_

#include <atomic>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "torchmem/core/types.h"

namespace torchmem {

struct Attribution {
  TagId tag = kNoTag;
  ScopeId scope = kNoScope;
};

// Process-wide interning of tag names. Ids are dense, starting at 1, and
// stay valid for the life of the process.
class TagRegistry {
 public:
  static constexpr std::size_t kMaxNameLength = 256;

  static absl::StatusOr<TagId> Intern(std::string_view name);
  // "untagged" for kNoTag; "<unknown tag N>" for ids never handed out.
  static std::string Name(TagId tag);
  // Number of ids handed out so far (excluding kNoTag).
  static std::size_t Count();
};

// --- The calling thread's stacks -------------------------------------------

absl::Status PushTag(TagId tag);
absl::Status PopTag(TagId tag);
// Innermost tag of this thread's own stack, kNoTag if empty.
TagId CurrentThreadTag();
// Innermost tag and scope of this thread's own stacks (no propagated state).
Attribution CurrentThreadAttribution();

// Opens a scope nested in this thread's innermost open scope.
ScopeId OpenScope();
// Closes `scope`, which must be this thread's innermost open scope, and
// returns its parent (kNoScope at the outermost level).
absl::StatusOr<ScopeId> CloseScope(ScopeId scope);
bool IsScopeOpen(ScopeId scope);
// Parent of an open scope; kNoScope if it has none or is not open.
ScopeId OpenScopeParent(ScopeId scope);

// Reads state propagated to a thread by its creator (e.g. PyTorch's
// ThreadLocalDebugInfo). Fills `out` and returns true if there is any.
using AttributionProvider = bool (*)(Attribution* out);
void SetAttributionProvider(AttributionProvider provider);

namespace internal {
// Hold / release the tag and scope registries around fork() (fork_safety.cc).
void LockAttributionForFork();
void UnlockAttributionAfterFork();
// Count of tags pushed and scopes opened, over all threads. Lets the hot
// path skip everything when nothing is attributed anywhere.
extern std::atomic<int> g_open_frames;
Attribution SlowCurrentAttribution();
}  // namespace internal

// The attribution of an allocation made now by the calling thread.
inline Attribution CurrentAttribution() {
  if (internal::g_open_frames.load(std::memory_order_relaxed) == 0) return {};
  return internal::SlowCurrentAttribution();
}

}  // namespace torchmem

#endif  // TORCHMEM_CORE_ATTRIBUTION_H_
