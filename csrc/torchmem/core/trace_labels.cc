#include "torchmem/core/trace_labels.h"

#include <atomic>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace torchmem {
namespace {

struct LabelTable {
  std::mutex mutex;
  std::vector<std::string> texts{std::string()};  // index 0: no label
  absl::flat_hash_map<std::string, TraceLabel> ids;
};

LabelTable& Table() {
  static auto* table = new LabelTable;  // leaked: used until the process ends
  return *table;
}

std::atomic<TraceLabel> g_user_metadata{kNoTraceLabel};
thread_local std::vector<TraceLabel> t_compile_contexts;

}  // namespace

TraceLabel InternTraceLabel(std::string_view text) {
  if (text.empty()) return kNoTraceLabel;
  LabelTable& table = Table();
  std::lock_guard<std::mutex> lock(table.mutex);
  auto [it, inserted] =
      table.ids.try_emplace(std::string(text), static_cast<TraceLabel>(table.texts.size()));
  if (inserted) table.texts.emplace_back(text);
  return it->second;
}

std::string TraceLabelText(TraceLabel label) {
  if (label == kNoTraceLabel) return std::string();
  LabelTable& table = Table();
  std::lock_guard<std::mutex> lock(table.mutex);
  return label < table.texts.size() ? table.texts[label] : std::string();
}

void SetTraceUserMetadata(TraceLabel label) {
  g_user_metadata.store(label, std::memory_order_relaxed);
}

TraceLabel TraceUserMetadata() { return g_user_metadata.load(std::memory_order_relaxed); }

void PushTraceCompileContext(TraceLabel label) { t_compile_contexts.push_back(label); }

void PopTraceCompileContext() {
  if (!t_compile_contexts.empty()) t_compile_contexts.pop_back();
}

TraceLabel TraceCompileContext() {
  return t_compile_contexts.empty() ? kNoTraceLabel : t_compile_contexts.back();
}

}  // namespace torchmem
