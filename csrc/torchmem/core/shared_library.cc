#include "torchmem/core/shared_library.h"

namespace torchmem {

std::uint64_t SharedLibraryFingerprint() { return CompiledInterfaceFingerprint(); }

}  // namespace torchmem
