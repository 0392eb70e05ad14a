/* TorchmemWalkOwnFrames for CPython 3.11: _PyInterpreterFrames (private,
 * Include/internal/pycore_frame.h) linked by `previous` from
 * PyThreadState.cframe->current_frame. prev_instr points at the instruction
 * being executed (the CALL, for a frame that called into C). */
#include "torchmem/python/frame_walk.h"

#if TORCHMEM_GIL_FREE_WALK && PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000

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
