// CPython API differences between the supported versions (3.10 to 3.13),
// behind one name each, so the binding files need no version checks.
#ifndef TORCHMEM_PYTHON_PYTHON_COMPAT_H_
#define TORCHMEM_PYTHON_PYTHON_COMPAT_H_

#include <Python.h>

namespace torchmem::python {

// True once the interpreter is gone or shutting down: other threads' states
// are being torn down and PyGILState_Ensure would end the calling thread.
// Safe without the GIL (an atomic read of the runtime's state).
inline bool InterpreterGone() {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();  // public since 3.13
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();  // removed in 3.13
#endif
}

}  // namespace torchmem::python

#endif  // TORCHMEM_PYTHON_PYTHON_COMPAT_H_
