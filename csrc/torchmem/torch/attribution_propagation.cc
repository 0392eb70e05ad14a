#include "torchmem/torch/attribution_propagation.h"

#include <atomic>
#include <memory>
#include <string_view>

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

// One per thread that ever opened a tag or scope; its fields follow that
// thread's stacks. Workers read them concurrently, hence the atomics.
class AttributionInfo final : public c10::DebugInfoBase {
 public:
  void Store(const Attribution& attribution) {
    tag_.store(attribution.tag, std::memory_order_relaxed);
    scope_.store(attribution.scope, std::memory_order_relaxed);
  }
  Attribution Load() const {
    return Attribution{tag_.load(std::memory_order_relaxed),
                       scope_.load(std::memory_order_relaxed)};
  }

 private:
  std::atomic<TagId> tag_{kNoTag};
  std::atomic<ScopeId> scope_{kNoScope};
};

bool ReadPropagatedAttribution(Attribution* out) {
  const auto* info =
      static_cast<const AttributionInfo*>(c10::ThreadLocalDebugInfo::get(kAttributionInfo));
  if (info == nullptr) return false;
  *out = info->Load();
  return true;
}

}  // namespace

void InstallAttributionPropagation() { SetAttributionProvider(&ReadPropagatedAttribution); }

void PublishThreadAttribution() {
  thread_local std::shared_ptr<AttributionInfo> own;
  if (own == nullptr) own = std::make_shared<AttributionInfo>();
  own->Store(CurrentThreadAttribution());
  // Push our entry once per chain: again only if something replaced the
  // thread's chain since (the entry found would then not be ours).
  if (c10::ThreadLocalDebugInfo::get(kAttributionInfo) != own.get()) {
    c10::ThreadLocalDebugInfo::_push(kAttributionInfo, own);
  }
}

}  // namespace torchmem::torch_glue
