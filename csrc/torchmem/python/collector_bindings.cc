// torchmem._C.instances_of / types_of / objects_of_types / subset_garbage / unreachable_among:
// the passes over the heap of a leak check's exit, in C (subset_collection.h;
// torchmem/leaks/collector.py and tensors.py use them).
#include "torchmem/python/bindings.h"
#include "torchmem/python/subset_collection.h"

namespace torchmem::python {

void RegisterCollector(py::module_& m) {
  m.def(
      "instances_of",
      [](py::list objects, py::object type) {
        PyObject* found = TorchmemInstancesOf(objects.ptr(), type.ptr());
        if (found == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::list>(found);
      },
      py::arg("objects"), py::arg("type"));
  m.def(
      "subset_garbage",
      [](py::list objects, py::list seeds, Py_ssize_t max_passes, Py_ssize_t max_members) {
        PyObject* result =
            TorchmemSubsetGarbage(objects.ptr(), seeds.ptr(), max_passes, max_members);
        if (result == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::tuple>(result);
      },
      py::arg("objects"), py::arg("seeds"), py::arg("max_passes"), py::arg("max_members"));
  m.def(
      "types_of",
      [](py::list objects) {
        PyObject* result = TorchmemTypesOf(objects.ptr());
        if (result == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::set>(result);
      },
      py::arg("objects"));
  m.def(
      "objects_of_types",
      [](py::list objects, py::object types) {
        PyObject* result = TorchmemObjectsOfTypes(objects.ptr(), types.ptr());
        if (result == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::list>(result);
      },
      py::arg("objects"), py::arg("types"));
  m.def(
      "unreachable_among",
      [](py::list objects) {
        PyObject* result = TorchmemUnreachableAmong(objects.ptr());
        if (result == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::list>(result);
      },
      py::arg("objects"));
}

}  // namespace torchmem::python
