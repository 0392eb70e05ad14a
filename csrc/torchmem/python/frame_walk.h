/* Reading the calling thread's own Python frames without the GIL.
 *
 * The one interface behind which each CPython minor version's private frame
 * layout lives: frame_walk_py310.c ... frame_walk_py313.c each implement it
 * from that version's own headers (3.11+ from Include/internal/
 * pycore_frame.h), and only the file matching the Python being built for
 * compiles to anything. They are C, not C++, because the internal headers
 * are written for the C compiler that builds CPython (3.13's require
 * Py_BUILD_CORE and use C-only constructs).
 *
 * Why no lock is needed: a thread's frame chain is pushed, popped and moved
 * only by that thread. While the calling thread is in C or C++ code (an
 * allocation called from a torch op), its chain is frozen and every frame on
 * it holds a strong reference to its code object. Other threads may at most
 * attach frame objects to our frames, which the walkers never read.
 *
 * Invariant: the walkers read only the calling thread's frames, allocate
 * nothing, run no Python code and never take the GIL.
 */
#ifndef TORCHMEM_PYTHON_FRAME_WALK_H_
#define TORCHMEM_PYTHON_FRAME_WALK_H_

#include <Python.h>

/* The versions whose layout the walkers know. Elsewhere (or when built with
 * TORCHMEM_STACK_CAPTURE_FORCE_GIL) stack capture takes the GIL and uses the
 * public frame API instead. */
#if PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030E0000 && \
    !defined(TORCHMEM_STACK_CAPTURE_FORCE_GIL)
#define TORCHMEM_GIL_FREE_WALK 1
#else
#define TORCHMEM_GIL_FREE_WALK 0
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* One frame: its code object (borrowed: the frame holds it) and the byte
 * offset of the instruction it is executing, as PyCode_Addr2Line takes it. */
typedef struct TorchmemRawFrame {
  PyCodeObject* code;
  int offset;
} TorchmemRawFrame;

/* Writes the frames of `tstate` (which must be the calling thread's own
 * state), innermost first, into out[0..capacity), skipping frames that have
 * not started executing (CPython hides them from tracebacks too) and the
 * interpreter's own shim frames. Returns the number written; sets
 * *truncated to 1 if frames were left out because `capacity` was reached,
 * to 0 otherwise. */
int TorchmemWalkOwnFrames(PyThreadState* tstate, TorchmemRawFrame* out, int capacity,
                          int* truncated);

#ifdef __cplusplus
}
#endif

#endif /* TORCHMEM_PYTHON_FRAME_WALK_H_ */
