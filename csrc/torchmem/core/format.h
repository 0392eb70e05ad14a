// Human-readable byte counts for messages ("20.00 MiB"), as PyTorch prints them.
#ifndef TORCHMEM_CORE_FORMAT_H_
#define TORCHMEM_CORE_FORMAT_H_

#include <cstdint>
#include <string>

namespace torchmem {

std::string FormatBytes(std::int64_t bytes);

}  // namespace torchmem

#endif  // TORCHMEM_CORE_FORMAT_H_
