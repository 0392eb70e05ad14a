#include "torchmem/core/format.h"

#include <cstdlib>

#include "absl/strings/str_format.h"

namespace torchmem {

std::string FormatBytes(std::int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (std::llabs(bytes) < 1024) return absl::StrFormat("%d B", bytes);
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 || value <= -1024.0) {
    if (unit == 4) break;
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

}  // namespace torchmem
