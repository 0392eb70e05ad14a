"""Run by test_frame_locals.py under each Python found: reading another thread's locals
must not keep them alive (torchmem/leaks/frame_locals.py), where plain ``f_locals`` does on
3.10-3.12. Imports frame_locals.py by path, so it needs neither torch nor a build.

Prints ``local_items: freed`` (or ``kept``) and ``f_locals: freed`` (or ``kept``).
"""

import gc
import importlib.util
import sys
import threading
import weakref

spec = importlib.util.spec_from_file_location("frame_locals", sys.argv[1])
frame_locals = importlib.util.module_from_spec(spec)
spec.loader.exec_module(frame_locals)


class Big:
    pass


def worker(ready, go, dropped, finish, refs):
    big = Big()
    refs.append(weakref.ref(big))
    ready.set()
    go.wait()
    del big  # from here on nothing but a snapshot could keep it
    dropped.set()
    finish.wait()


def survives(read) -> bool:
    """Whether a local another thread deleted survives after ``read`` read its locals."""
    ready, go, dropped, finish = (threading.Event() for _ in range(4))
    refs: list = []
    thread = threading.Thread(target=worker, args=(ready, go, dropped, finish, refs))
    thread.start()
    ready.wait()
    frame = sys._current_frames()[thread.ident]
    while frame.f_code.co_name != "worker":
        frame = frame.f_back
    values = read(frame)
    assert any(isinstance(value, Big) for value in values)
    del frame, values
    go.set()
    dropped.wait()
    gc.collect()
    alive = refs[0]() is not None
    finish.set()
    thread.join()
    return alive


print("local_items:", "kept" if survives(lambda f: [v for _, v in frame_locals.local_items(f)]) else "freed")
print("f_locals:", "kept" if survives(lambda f: list(f.f_locals.values())) else "freed")
