#include "torchmem/core/warnings.h"

#include <atomic>
#include <cstdio>

namespace torchmem {
namespace {

std::atomic<WarningHandler> g_handler{nullptr};

void WriteToStderr(absl::string_view message) {
  std::fprintf(stderr, "torchmem warning: %.*s\n", static_cast<int>(message.size()),
               message.data());
}

}  // namespace

void SetWarningHandler(WarningHandler handler) {
  g_handler.store(handler, std::memory_order_release);
}

void Warn(absl::string_view message) {
  WarningHandler handler = g_handler.load(std::memory_order_acquire);
  (handler != nullptr ? handler : &WriteToStderr)(message);
}

}  // namespace torchmem
