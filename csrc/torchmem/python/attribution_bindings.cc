// Tags and leak scopes of the calling thread.
#include <string>

#include "torchmem/core/attribution.h"
#include "torchmem/core/engine.h"
#include "torchmem/python/bindings.h"
#include "torchmem/torch/attribution_propagation.h"

namespace torchmem::python {

void RegisterAttribution(py::module_& m) {
  torch_glue::InstallAttributionPropagation();

  m.def(
      "push_tag",
      [](const std::string& name) {
        absl::StatusOr<TagId> tag = TagRegistry::Intern(name);
        ThrowIfError(tag.status());
        ThrowIfError(PushTag(*tag));
        torch_glue::PublishThreadAttribution();
      },
      py::arg("name"), "Makes `name` the innermost tag of this thread.");
  m.def(
      "pop_tag",
      [](const std::string& name) {
        absl::StatusOr<TagId> tag = TagRegistry::Intern(name);
        ThrowIfError(tag.status());
        ThrowIfError(PopTag(*tag));
        torch_glue::PublishThreadAttribution();
      },
      py::arg("name"), "Ends `name`, which must be this thread's innermost tag.");
  m.def("current_tag", []() -> py::object {
    const TagId tag = CurrentThreadTag();
    if (tag == kNoTag) return py::none();
    return py::str(TagRegistry::Name(tag));
  });
  m.def("open_scope", []() {
    const ScopeId scope = OpenScope();
    torch_glue::PublishThreadAttribution();
    return scope;
  });
  m.def(
      "close_scope",
      [](ScopeId scope) {
        absl::StatusOr<std::vector<ScopeSurvivors>> closed;
        {
          py::gil_scoped_release release;
          closed = CloseLeakScope(scope);
        }
        ThrowIfError(closed.status());
        torch_glue::PublishThreadAttribution();
        py::list out;
        for (const ScopeSurvivors& survivors : *closed) out.append(SurvivorsToDict(survivors));
        return out;
      },
      py::arg("scope"),
      "Closes this thread's innermost scope; returns, per engine, the blocks allocated inside "
      "that are still allocated or pending.");
  m.def("is_scope_open", &IsScopeOpen, py::arg("scope"));
}

}  // namespace torchmem::python
