/* TorchmemWalkOwnFrames for CPython 3.10: frames are PyFrameObjects linked
 * by f_back from PyThreadState.frame (both in the cpython/ headers). The
 * interpreter stores f_lasti, in code units, before every instruction it
 * dispatches, so a frame that called into C holds the CALL's position. */
#include "torchmem/python/frame_walk.h"

#if TORCHMEM_GIL_FREE_WALK && PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030B0000

#include <frameobject.h>

int TorchmemWalkOwnFrames(PyThreadState* tstate, TorchmemRawFrame* out, int capacity,
                          int* truncated) {
  int count = 0;
  *truncated = 0;
  for (PyFrameObject* frame = tstate->frame; frame != NULL; frame = frame->f_back) {
    /* -1: created but not started (a frame being set up for a call). */
    if (frame->f_lasti < 0) continue;
    if (count == capacity) {
      *truncated = 1;
      break;
    }
    out[count].code = frame->f_code;
    out[count].offset = frame->f_lasti * (int)sizeof(_Py_CODEUNIT);
    ++count;
  }
  return count;
}

#endif
