// The version of the torch headers this translation unit is compiled
// against, as one number, and the one place where code that must differ
// between torch releases asks for it.
//
// torchmem supports torch 2.9 through 2.15. Every release in that range has
// torch/version.h (under torch/csrc/api/include) defining
// TORCH_VERSION_MAJOR/MINOR/PATCH (since 2.12 through
// torch/headeronly/version.h). Code that adapts to a release tests
// TORCHMEM_TORCH_VERSION_AT_LEAST(2, 13) and says in a comment what changed
// in that release, so the branches can be deleted when the oldest supported
// release passes them.
//
// Invariant: building against a torch outside the supported range fails
// here, at compile time, with a message that names the range.
#ifndef TORCHMEM_TORCH_TORCH_VERSION_H_
#define TORCHMEM_TORCH_TORCH_VERSION_H_

#include <torch/version.h>

// major * 10000 + minor * 100 + patch: 2.14.1 is 21401.
#define TORCHMEM_TORCH_VERSION \
  (TORCH_VERSION_MAJOR * 10000 + TORCH_VERSION_MINOR * 100 + TORCH_VERSION_PATCH)
#define TORCHMEM_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCHMEM_TORCH_VERSION >= (major)*10000 + (minor)*100)

// The supported range, as pyproject.toml states it (torch>=2.9,<2.16).
#define TORCHMEM_TORCH_OLDEST_SUPPORTED 20900
#define TORCHMEM_TORCH_FIRST_UNSUPPORTED 21600

static_assert(TORCHMEM_TORCH_VERSION >= TORCHMEM_TORCH_OLDEST_SUPPORTED &&
                  TORCHMEM_TORCH_VERSION < TORCHMEM_TORCH_FIRST_UNSUPPORTED,
              "torchmem supports torch 2.9 through 2.15: install one of those (pip install "
              "'torch>=2.9,<2.16') and rebuild torchmem against it");

#endif  // TORCHMEM_TORCH_TORCH_VERSION_H_
