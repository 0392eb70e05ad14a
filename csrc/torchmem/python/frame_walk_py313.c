/* TorchmemWalkOwnFrames for CPython 3.13: _PyInterpreterFrame
 * (Include/internal/pycore_frame.h) now hangs directly off
 * PyThreadState.current_frame (the _PyCFrame is gone), names its code
 * object f_executable (a code object, or None for shim frames owned by the
 * C stack), and keeps instr_ptr: the instruction executing now. */
#include "torchmem/python/frame_walk.h"

#if TORCHMEM_GIL_FREE_WALK && PY_VERSION_HEX >= 0x030D0000 && PY_VERSION_HEX < 0x030E0000

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

int TorchmemWalkOwnFrames(PyThreadState* tstate, TorchmemRawFrame* out, int capacity,
                          int* truncated) {
  int count = 0;
  *truncated = 0;
  for (_PyInterpreterFrame* frame = tstate->current_frame; frame != NULL; frame = frame->previous) {
    /* Shims (FRAME_OWNED_BY_CSTACK) and frames before their first RESUME;
     * _PyFrame_IsIncomplete checks both. */
    if (frame->owner == FRAME_OWNED_BY_CSTACK || !PyCode_Check(frame->f_executable)) continue;
    if (_PyFrame_IsIncomplete(frame)) continue;
    if (count == capacity) {
      *truncated = 1;
      break;
    }
    out[count].code = (PyCodeObject*)frame->f_executable;
    out[count].offset = _PyInterpreterFrame_LASTI(frame) * (int)sizeof(_Py_CODEUNIT);
    ++count;
  }
  return count;
}

#endif
