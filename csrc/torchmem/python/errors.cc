// Maps absl::Status to Python exceptions.
#include <string>

#include "torchmem/python/bindings.h"

namespace torchmem::python {

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
      throw py::value_error(message);
    case absl::StatusCode::kResourceExhausted: {
      py::object out_of_memory = py::module_::import("torch").attr("OutOfMemoryError");
      PyErr_SetString(out_of_memory.ptr(), message.c_str());
      throw py::error_already_set();
    }
    default:
      throw std::runtime_error(message);
  }
}

}  // namespace torchmem::python
