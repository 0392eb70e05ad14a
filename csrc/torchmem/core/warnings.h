// Warnings the engine raises about conditions it handled but the user should
// know about (an event query that failed, ...). The default handler writes
// them to stderr; the torch glue routes them to PyTorch's warning handler
// (TORCH_WARN, hence Python's warnings module).
//
// A handler may be called with an engine's lock held: it must not call into
// any engine, and should be quick.
#ifndef TORCHMEM_CORE_WARNINGS_H_
#define TORCHMEM_CORE_WARNINGS_H_

#include "absl/strings/string_view.h"

namespace torchmem {

using WarningHandler = void (*)(absl::string_view message);

// nullptr restores the default (stderr).
void SetWarningHandler(WarningHandler handler);
void Warn(absl::string_view message);

}  // namespace torchmem

#endif  // TORCHMEM_CORE_WARNINGS_H_
