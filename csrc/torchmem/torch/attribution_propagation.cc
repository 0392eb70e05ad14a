#include "torchmem/torch/attribution_propagation.h"

#include <atomic>
#include <memory>
#include <string_view>
#include <utility>

#include <c10/util/ThreadLocalDebugInfo.h>

#include "torchmem/core/attribution.h"
#include "torchmem/torch/torch_version.h"

namespace torchmem::torch_glue {
namespace {

// The slot torchmem's entries occupy in a thread's debug-info chain. c10
// finds an entry by comparing kinds along the chain, nothing else.
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 13)
// Since 2.13 a kind is identified by the address of a name with static
// storage duration, so every library gets a slot of its own.
constexpr std::string_view kAttributionInfoName = "TORCHMEM_ATTRIBUTION";
const c10::DebugInfoKind kAttributionInfo(&kAttributionInfoName);
#else
// Up to 2.12 DebugInfoKind is an enum class over uint8_t whose named values
// (0 to 6) are PyTorch's own. c10 only compares kinds (ThreadLocalDebugInfo
// get/_push/_pop), so any other value of the underlying type is a slot no
// PyTorch code uses; a value far from the named ones stays clear of any
// PyTorch may add.
constexpr c10::DebugInfoKind kAttributionInfo = static_cast<c10::DebugInfoKind>(0xC7);
#endif

// A thread's innermost open scope, shared by every entry that thread pushed:
// scopes are read live (see the header).
struct ScopeCell {
  std::atomic<ScopeId> scope{kNoScope};
};

// One entry of torchmem's kind in a debug-info chain. Immutable except for
// the scope it reads through `scope_`; workers read it concurrently.
class AttributionInfo final : public c10::DebugInfoBase {
 public:
  AttributionInfo(TagId tag, std::shared_ptr<const ScopeCell> scope,
                  const AttributionInfo* inherited)
      : tag_(tag), scope_(std::move(scope)), inherited_(inherited) {}

  Attribution Load() const {
    Attribution out{tag_, scope_->scope.load(std::memory_order_relaxed)};
    if (out.scope == kNoScope && inherited_ != nullptr) out.scope = inherited_->Load().scope;
    return out;
  }

 private:
  const TagId tag_;  // the tag open when this entry was pushed (snapshot)
  const std::shared_ptr<const ScopeCell> scope_;
  // The entry of our kind below this one in the chain, if any: what the
  // pushing thread had inherited. Not owned: every holder of this entry holds
  // the chain node that owns it, whose parent chain owns `inherited_`.
  const AttributionInfo* const inherited_;
};

bool ReadPropagatedAttribution(Attribution* out) {
  const auto* info =
      static_cast<const AttributionInfo*>(c10::ThreadLocalDebugInfo::get(kAttributionInfo));
  if (info == nullptr) return false;
  *out = info->Load();
  return true;
}

// What the calling thread last published.
struct ThreadEntry {
  std::shared_ptr<ScopeCell> scope = std::make_shared<ScopeCell>();
  // The chain our entry was pushed onto, and the chain with our entry on top
  // as we left it (null when we pushed nothing).
  std::shared_ptr<c10::ThreadLocalDebugInfo> below;
  std::shared_ptr<c10::ThreadLocalDebugInfo> head;
};

}  // namespace

void InstallAttributionPropagation() { SetAttributionProvider(&ReadPropagatedAttribution); }

void PublishThreadAttribution() {
  thread_local ThreadEntry entry;
  const Attribution own = CurrentThreadAttribution();
  entry.scope->scope.store(own.scope, std::memory_order_relaxed);

  // Take our previous entry off the chain if it is still on top; if anything
  // else changed the chain since, build on what is there now.
  std::shared_ptr<c10::ThreadLocalDebugInfo> current = c10::ThreadLocalDebugInfo::current();
  if (entry.head != nullptr && current == entry.head) {
    c10::ThreadLocalDebugInfo::_forceCurrentDebugInfo(entry.below);
  } else {
    entry.below = std::move(current);
  }
  entry.head.reset();
  if (own.tag == kNoTag && own.scope == kNoScope) {
    entry.below.reset();  // nothing of our own: what the thread inherited stays in force
    return;
  }
  const auto* inherited =
      static_cast<const AttributionInfo*>(c10::ThreadLocalDebugInfo::get(kAttributionInfo));
  const TagId tag =
      own.tag != kNoTag ? own.tag : (inherited != nullptr ? inherited->Load().tag : kNoTag);
  c10::ThreadLocalDebugInfo::_push(kAttributionInfo,
                                   std::make_shared<AttributionInfo>(tag, entry.scope, inherited));
  entry.head = c10::ThreadLocalDebugInfo::current();
}

}  // namespace torchmem::torch_glue
