#include "torchmem/core/attribution.h"

#include <algorithm>
#include <atomic>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "torchmem/core/mutex.h"

namespace torchmem {
namespace internal {
std::atomic<int> g_open_frames{0};
}  // namespace internal

namespace {

struct TagTable {
  Mutex mutex;
  absl::flat_hash_map<std::string, TagId> ids ABSL_GUARDED_BY(mutex);
  std::vector<std::string> names ABSL_GUARDED_BY(mutex);  // names[id - 1]
};

// Leaked on purpose: tags and scopes are used from thread-exit and
// static-destruction paths, after function-local statics may be gone.
TagTable& Tags() {
  static TagTable* table = new TagTable;
  return *table;
}

struct OpenScopes {
  Mutex mutex;
  absl::flat_hash_map<ScopeId, ScopeId> parent_of ABSL_GUARDED_BY(mutex);
};

OpenScopes& Scopes() {
  static OpenScopes* scopes = new OpenScopes;
  return *scopes;
}

std::atomic<ScopeId> g_next_scope_id{1};
std::atomic<AttributionProvider> g_provider{nullptr};

// This thread's stacks. When a thread ends with entries left, they are
// dropped so that the process-wide counters stay exact.
struct ThreadStacks {
  std::vector<TagId> tags;
  std::vector<ScopeId> scopes;

  ~ThreadStacks() {
    internal::g_open_frames.fetch_sub(static_cast<int>(tags.size() + scopes.size()),
                                      std::memory_order_relaxed);
    if (scopes.empty()) return;
    OpenScopes& open = Scopes();
    MutexLock lock(&open.mutex);
    for (ScopeId scope : scopes) open.parent_of.erase(scope);
  }
};

ThreadStacks& Stacks() {
  thread_local ThreadStacks stacks;
  return stacks;
}

}  // namespace

absl::StatusOr<TagId> TagRegistry::Intern(std::string_view name) {
  if (name.empty()) {
    return absl::InvalidArgumentError("tag names must not be empty");
  }
  if (name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tag name is %d characters long; the limit is %d", name.size(), kMaxNameLength));
  }
  TagTable& table = Tags();
  MutexLock lock(&table.mutex);
  auto [it, inserted] = table.ids.try_emplace(std::string(name), 0);
  if (inserted) {
    table.names.emplace_back(name);
    it->second = static_cast<TagId>(table.names.size());
  }
  return it->second;
}

std::string TagRegistry::Name(TagId tag) {
  if (tag == kNoTag) return "untagged";
  TagTable& table = Tags();
  MutexLock lock(&table.mutex);
  if (tag > table.names.size()) return absl::StrCat("<unknown tag ", tag, ">");
  return table.names[tag - 1];
}

std::size_t TagRegistry::Count() {
  TagTable& table = Tags();
  MutexLock lock(&table.mutex);
  return table.names.size();
}

absl::Status PushTag(TagId tag) {
  if (tag == kNoTag || tag > TagRegistry::Count()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot push tag id %d: it was not returned by TagRegistry::Intern", tag));
  }
  Stacks().tags.push_back(tag);
  internal::g_open_frames.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status PopTag(TagId tag) {
  std::vector<TagId>& tags = Stacks().tags;
  if (tags.empty()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot pop tag '%s': no tag is active on this thread", TagRegistry::Name(tag)));
  }
  if (tags.back() != tag) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot pop tag '%s': the innermost tag on this thread is '%s'; tags must be "
        "closed in the reverse order they were opened, on the thread that opened them",
        TagRegistry::Name(tag), TagRegistry::Name(tags.back())));
  }
  tags.pop_back();
  internal::g_open_frames.fetch_sub(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

TagId CurrentThreadTag() {
  const std::vector<TagId>& tags = Stacks().tags;
  return tags.empty() ? kNoTag : tags.back();
}

Attribution CurrentThreadAttribution() {
  const ThreadStacks& stacks = Stacks();
  Attribution result;
  if (!stacks.tags.empty()) result.tag = stacks.tags.back();
  if (!stacks.scopes.empty()) result.scope = stacks.scopes.back();
  return result;
}

ScopeId OpenScope() {
  std::vector<ScopeId>& scopes = Stacks().scopes;
  const ScopeId scope = g_next_scope_id.fetch_add(1, std::memory_order_relaxed);
  const ScopeId parent = scopes.empty() ? kNoScope : scopes.back();
  {
    OpenScopes& open = Scopes();
    MutexLock lock(&open.mutex);
    open.parent_of.emplace(scope, parent);
  }
  scopes.push_back(scope);
  internal::g_open_frames.fetch_add(1, std::memory_order_relaxed);
  return scope;
}

absl::StatusOr<ScopeId> CloseScope(ScopeId scope) {
  std::vector<ScopeId>& scopes = Stacks().scopes;
  if (scopes.empty() || scopes.back() != scope) {
    if (!IsScopeOpen(scope)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "cannot close leak scope %d: it is not open (closed already, or never opened)", scope));
    }
    if (std::find(scopes.begin(), scopes.end(), scope) == scopes.end()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "cannot close leak scope %d on this thread: it was opened on another thread", scope));
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot close leak scope %d: scope %d, opened inside it, is still open; close the "
        "innermost scope first",
        scope, scopes.back()));
  }
  ScopeId parent = kNoScope;
  {
    OpenScopes& open = Scopes();
    MutexLock lock(&open.mutex);
    auto it = open.parent_of.find(scope);
    parent = it->second;
    open.parent_of.erase(it);
  }
  scopes.pop_back();
  internal::g_open_frames.fetch_sub(1, std::memory_order_relaxed);
  return parent;
}

bool IsScopeOpen(ScopeId scope) {
  OpenScopes& open = Scopes();
  MutexLock lock(&open.mutex);
  return open.parent_of.contains(scope);
}

ScopeId OpenScopeParent(ScopeId scope) {
  OpenScopes& open = Scopes();
  MutexLock lock(&open.mutex);
  auto it = open.parent_of.find(scope);
  return it == open.parent_of.end() ? kNoScope : it->second;
}

void SetAttributionProvider(AttributionProvider provider) {
  g_provider.store(provider, std::memory_order_release);
}

namespace internal {

void LockAttributionForFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Scopes().mutex.Lock();
  Tags().mutex.Lock();
}

void UnlockAttributionAfterFork() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Tags().mutex.Unlock();
  Scopes().mutex.Unlock();
}

Attribution SlowCurrentAttribution() {
  Attribution result = CurrentThreadAttribution();
  if (result.tag != kNoTag && result.scope != kNoScope) return result;
  // Whatever this thread did not set itself comes from propagated state.
  AttributionProvider provider = g_provider.load(std::memory_order_acquire);
  Attribution propagated;
  if (provider != nullptr && provider(&propagated)) {
    if (result.tag == kNoTag) result.tag = propagated.tag;
    if (result.scope == kNoScope) result.scope = propagated.scope;
  }
  return result;
}

}  // namespace internal
}  // namespace torchmem
