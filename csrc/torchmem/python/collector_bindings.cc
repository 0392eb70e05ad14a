// torchmem._C.instances_of / types_of / objects_of_types / subset_garbage / unreachable_among:
// the passes over the heap of a leak check's exit, in C (subset_collection.h;
// torchmem/leaks/collector.py and tensors.py use them).
#include "torchmem/python/bindings.h"
#include "torchmem/python/subset_collection.h"

namespace torchmem::python {
namespace {

// A new reference from a helper of subset_collection.h, or the Python error it set.
template <typename Result>
Result Owned(PyObject* result) {
  if (result == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<Result>(result);
}

}  // namespace

void RegisterCollector(py::module_& m) {
  m.def(
      "instances_of",
      [](py::list objects, py::object type) {
        return Owned<py::list>(TorchmemInstancesOf(objects.ptr(), type.ptr()));
      },
      py::arg("objects"), py::arg("type"));
  m.def(
      "subset_garbage",
      [](py::list objects, py::list seeds, Py_ssize_t max_passes, Py_ssize_t max_members) {
        return Owned<py::tuple>(
            TorchmemSubsetGarbage(objects.ptr(), seeds.ptr(), max_passes, max_members));
      },
      py::arg("objects"), py::arg("seeds"), py::arg("max_passes"), py::arg("max_members"));
  m.def(
      "types_of", [](py::list objects) { return Owned<py::set>(TorchmemTypesOf(objects.ptr())); },
      py::arg("objects"));
  m.def(
      "objects_of_types",
      [](py::list objects, py::object types) {
        return Owned<py::list>(TorchmemObjectsOfTypes(objects.ptr(), types.ptr()));
      },
      py::arg("objects"), py::arg("types"));
  m.def(
      "unreachable_among",
      [](py::list objects) { return Owned<py::list>(TorchmemUnreachableAmong(objects.ptr())); },
      py::arg("objects"));
}

}  // namespace torchmem::python
