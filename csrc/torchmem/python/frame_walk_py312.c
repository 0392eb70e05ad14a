/* TorchmemWalkOwnFrames for CPython 3.12: as 3.11 (_PyInterpreterFrame from
 * Include/internal/pycore_frame.h, reached through PyThreadState.cframe),
 * plus shim frames: the interpreter pushes a frame owned by the C stack
 * (FRAME_OWNED_BY_CSTACK) when C code calls back into Python; it has a
 * placeholder code object and is not part of the Python stack. */
#include "torchmem/python/frame_walk.h"

#if TORCHMEM_GIL_FREE_WALK && PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

int TorchmemWalkOwnFrames(PyThreadState* tstate, TorchmemRawFrame* out, int capacity,
                          int* truncated) {
  int count = 0;
  *truncated = 0;
  const _PyCFrame* cframe = tstate->cframe;
  for (_PyInterpreterFrame* frame = cframe == NULL ? NULL : cframe->current_frame; frame != NULL;
       frame = frame->previous) {
    if (frame->owner == FRAME_OWNED_BY_CSTACK) continue;
    if (_PyFrame_IsIncomplete(frame)) continue; /* before its first RESUME */
    if (count == capacity) {
      *truncated = 1;
      break;
    }
    out[count].code = frame->f_code;
    out[count].offset = _PyInterpreterFrame_LASTI(frame) * (int)sizeof(_Py_CODEUNIT);
    ++count;
  }
  return count;
}

#endif
