"""``torchmem.leak_check``: blocks allocated inside a region and still alive when it ends.

    with torchmem.leak_check():          # raises torchmem.LeakError naming the holders
        evaluate(model, loader)

    @torchmem.leak_check(warmup=1)       # reused: the first call may create lasting state
    def train_step(batch): ...

How an exit classifies the blocks the scope left behind (docs/leak-checks.md says the same
for users):

1. the engine hands over every block allocated inside (by any thread attributed to the
   scope) that is still allocated (or pending on other streams) when the scope closes;
2. blocks with an allowed tag, blocks of tensors passed to ``expect_alive``, tensors a
   decorated function returns, and everything left by warm-up entries are **allowed**;
3. the rest: with ``gc_collect``, one collection with ``gc.DEBUG_SAVEALL`` keeps the
   garbage for inspection (which cycle holds which block), then a normal collection frees
   it. A block that is gone afterwards was held by a reference cycle (**cycle**; whether
   that counts as leaked is the cycle policy's call, ``cycles=``); one still allocated,
   with the same sequence number (an address can be reused at once), is **reachable** and
   ``owners.find_owners`` names its holders (**allowed** when only objects passed in
   ``allow_held_by`` hold it).

Cost: a check that leaves nothing behind costs a scope open and close, a pause of the
collector's automatic collections while the exit runs, and stack capture while open (a
fraction of a microsecond per allocation); no garbage collection. One with survivors collects
the young generations; a block that survives that and that no root certainly alive holds is
decided from the garbage above its tensors (the collector's algorithm on those objects), the
whole heap collected only when that cannot decide it; the owner search runs for blocks still
held (``collector``). The
collector is never frozen or reconfigured while the checked code runs: it sees what it sees
outside a check.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import threading
import warnings
from dataclasses import dataclass, field

import torch

from torchmem._support.locks import ForkSafeLock
from torchmem.runtime import devices as _devices
from torchmem.runtime import install as _install
from torchmem.leaks import collector
from torchmem.leaks import cycle_policy
from torchmem.leaks import owners as _owners
from torchmem.stacks import capture as stack_capture
from torchmem import _C
from torchmem._support.units import format_bytes, parse_bytes
from torchmem._support.files import short_path
from torchmem._support.validate import require_int
from torchmem.leaks.classify import Classifier
from torchmem.leaks.report import Finding, LeakError, LeakReport

__all__ = ["leak_check", "expect_alive", "LeakError", "LeakReport", "Finding", "UnseenMemoryWarning"]


class UnseenMemoryWarning(RuntimeWarning):
    """A leak check ended with memory allocated inside that it could not see: CUDA memory
    PyTorch's own allocator holds while torchmem serves only the CPU. The report says so in
    place of "no leaks"."""

# Checks open on each thread, innermost last (closing must be LIFO per thread).
_thread_state = threading.local()
# Every open check, on any thread: expect_alive applies to all of them.
_open_checks_lock = ForkSafeLock()
_open_checks: list["_OpenCheck"] = []


def _thread_stack() -> list["_OpenCheck"]:
    stack = getattr(_thread_state, "stack", None)
    if stack is None:
        stack = _thread_state.stack = []
    return stack


@dataclass(eq=False)
class _OpenCheck:
    """One entry of a leak check, between its enter and exit."""

    scope: int
    thread: int
    report: LeakReport
    site: str
    capture: object = None
    expected: set = field(default_factory=set)  # (device, address, sequence)
    returned: set = field(default_factory=set)  # the same, for what a decorated function returned
    yielded: set = field(default_factory=set)  # the same, for what a decorated generator yielded
    allowed_roots: tuple = ()  # AllowedRoots of this entry only (what a decorated function returned)
    unseen_cuda_start: dict | None = None  # PyTorch's own CUDA allocator's bytes per device at enter


def _caller_site(depth: int) -> str:
    frame = sys._getframe(depth)
    return f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def _normalize_held_by(allow_held_by) -> tuple:
    """``{name: object}`` -> AllowedRoots; names say how reports start paths through them."""
    if allow_held_by is None:
        return ()
    if not isinstance(allow_held_by, dict):
        raise TypeError(
            "torchmem.leak_check: allow_held_by must be a dict {name: object} (memory held only through "
            f"these objects is allowed; the name is how reports call it), got {type(allow_held_by).__name__}"
        )
    roots = []
    for name, obj in allow_held_by.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"torchmem.leak_check: allow_held_by names must be non-empty str, got {name!r}")
        roots.append(_owners.AllowedRoot(name, obj, f"held only through {name}, which allow_held_by allows"))
    return tuple(roots)


def _normalize_tags(allow_tags) -> frozenset[str]:
    if isinstance(allow_tags, str):
        allow_tags = (allow_tags,)
    try:
        tags = tuple(allow_tags)
    except TypeError:
        raise TypeError(
            f"torchmem.leak_check: allow_tags must be tag names (a str or an iterable of str), "
            f"got {type(allow_tags).__name__}"
        ) from None
    for tag in tags:
        if not isinstance(tag, str):
            raise TypeError(
                f"torchmem.leak_check: allow_tags must contain tag names (str), got {tag!r} "
                f"({type(tag).__name__}); use the names given to torchmem.tag(...)"
            )
    return frozenset(tags)


def _normalize_devices(devices) -> frozenset[str] | None:
    if devices is None:
        return None
    if isinstance(devices, (str, int, torch.device)):
        devices = (devices,)
    out = set()
    for device in devices:
        out.add(_owners.device_key(_devices.normalize(device)))
    return frozenset(out)


def _block_identity(tensor: torch.Tensor) -> tuple[str, int, int] | None:
    """(device, address, sequence) of the torchmem block under ``tensor``, or None when
    torchmem did not allocate it (made before install, or on a device it does not serve)."""
    try:
        storage = torch._C.TensorBase.untyped_storage(tensor)
        device = _owners.device_key(storage.device)
        address = storage.data_ptr()
        block = _devices.engine(device).block(address)
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        return None
    return (device, block["address"], block["sequence"])


def expect_alive(tensor: torch.Tensor) -> torch.Tensor:
    """Declares that ``tensor``'s memory is meant to outlive the leak checks now open.

    Its block is reported as ``allowed`` instead of leaked by every leak check open in
    the process. Returns the tensor, so it reads inline::

        self.cache = torchmem.expect_alive(torch.zeros(n))

    Outside any leak check (and for tensors torchmem did not allocate) it does nothing.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"torchmem.expect_alive: expected a torch.Tensor, got {type(tensor).__name__} ({tensor!r:.60}); "
            "pass the tensor whose memory should outlive the leak check"
        )
    with _open_checks_lock:
        checks = list(_open_checks)
    if not checks:
        return tensor
    identity = _block_identity(tensor)
    if identity is not None:
        for check in checks:
            check.expected.add(identity)
    return tensor


_MAX_RETURNED_ITEMS = 100_000  # containers' items looked at for returned tensors (a huge list: its start)


def _returned_tensors(result) -> list[torch.Tensor]:
    """Tensors in what a decorated function returned, at any nesting depth: the value
    itself, the items of tuples (named ones too), lists, sets and dicts (keys and values),
    and the fields of dataclass instances. Other objects are followed by the owner search
    (``allow_returned`` makes the whole result an allowed root)."""
    found = []
    seen: set[int] = set()
    pending = [result]
    budget = _MAX_RETURNED_ITEMS
    while pending and budget > 0:
        value = pending.pop()
        budget -= 1
        if isinstance(value, torch.Tensor):
            found.append(value)
            continue
        if id(value) in seen:
            continue
        if isinstance(value, dict):
            seen.add(id(value))
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, (tuple, list, set, frozenset)):
            seen.add(id(value))
            pending.extend(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            seen.add(id(value))
            pending.extend(getattr(value, item.name, None) for item in dataclasses.fields(value))
    return found


_INSTALL_HINT = (
    "call torchmem.install('cpu') (and torchmem.install('cuda') before anything starts CUDA), or run "
    "under `python -m torchmem run` or `pytest --torchmem`, which install it"
)


def _served_or_refuse(devices: frozenset | None) -> list[str]:
    """The device types torchmem serves; raises when the check could see none of the memory
    it is asked about (it would say "no leaks" about memory it never saw)."""
    served = _install.installed_devices()
    if not served:
        raise RuntimeError(
            "torchmem.leak_check: torchmem is not installed, so this check cannot see any allocation and "
            f"would report 'no leaks' whatever the code keeps; {_INSTALL_HINT}"
        )
    if devices is not None and not any(name.split(":")[0] in served for name in devices):
        raise RuntimeError(
            f"torchmem.leak_check: devices={sorted(devices)} but torchmem serves only {', '.join(served)}, so "
            f"this check could see nothing there; {_INSTALL_HINT}"
        )
    return served


def _native_cuda_bytes() -> dict[int, int] | None:
    """Bytes PyTorch's own CUDA allocator has allocated, per device, when CUDA is started and
    torchmem does not serve it (memory no leak check can see); None otherwise."""
    if "cuda" in _install.installed_devices():
        return None
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return {}
    try:
        return {index: cuda.memory_allocated(index) for index in range(cuda.device_count())}
    except (RuntimeError, AssertionError):  # an allocator without statistics: nothing to compare
        return None


class leak_check:  # noqa: N801 - used like a function, as torch.no_grad is
    """Reports blocks allocated inside and still alive at the end: a context manager and a
    decorator, reusable (each ``with`` or call is one *entry*).

    Args:
        raise_on_leak: raise ``torchmem.LeakError`` (its ``.report`` is the ``LeakReport``)
            when leaked bytes exceed ``max_leaked_bytes``; otherwise only fill the report.
        gc_collect: run ``gc.collect()`` at the end, so memory held only by reference
            cycles is told apart (kind ``cycle``) from memory something still holds
            (``reachable``). Without it every survivor is ``reachable``.
        allow_tags: tag names (``torchmem.tag``) whose blocks may survive; ``"untagged"``
            (the name reports give memory allocated outside every tag) allows those.
        warmup: the first ``warmup`` entries of this object report survivors as
            ``allowed`` (an optimizer creating its state on step 1, lazy caches).
        capture_stacks: record the Python stack of allocations made inside, for the
            report's "allocated at" lines.
        max_leaked_bytes: leaked bytes (sum of block sizes) tolerated before raising; an
            int or a size string like ``"64 KiB"``.
        devices: only report blocks of these devices (``"cpu"``, ``"cuda:0"``, ...);
            default all devices torchmem serves.
        cycles: when memory that only a reference cycle held counts as leaked:
            ``"repeating"`` (default: when one allocation stack and holder type left
            ``cycle_repeats`` cycles in this entry, each dropped on its own: the Composer bug;
            an object that merely lives in a cycle is reported, not counted; each entry of a
            reused check is judged on its own),
            ``"always"`` or ``"never"``. See ``torchmem.leaks.cycle_policy``.
        cycle_repeats: separate cycles (int >= 2, default 8) that make ``"repeating"`` count.
        allow_held_by: ``{name: object}``: memory held only through these objects is
            allowed (reported with the path from ``name``), e.g. a model whose caches may
            keep what the checked code computed.

    ``with torchmem.leak_check() as report:`` binds the entry's ``LeakReport`` (filled on
    exit); ``check.report`` is the latest one. Locals of the enclosing function that still
    hold tensors made inside are reported (``del`` them, or ``expect_alive``). As a
    decorator, tensors the function returns are allowed.
    """

    def __init__(
        self,
        *,
        raise_on_leak: bool = True,
        gc_collect: bool = True,
        allow_tags=(),
        warmup: int = 0,
        capture_stacks: bool = True,
        max_leaked_bytes: int | str = 0,
        devices=None,
        cycles: str = cycle_policy.REPEATING,
        cycle_repeats: int = cycle_policy.DEFAULT_REPEATS,
        allow_held_by: dict | None = None,
    ):
        require_int(warmup, what="torchmem.leak_check: warmup", minimum=0, meaning="entries to allow")
        self.raise_on_leak = bool(raise_on_leak)
        self.gc_collect = bool(gc_collect)
        self.allow_tags = _normalize_tags(allow_tags)
        self.warmup = warmup
        self.capture_stacks = bool(capture_stacks)
        self.max_leaked_bytes = parse_bytes(max_leaked_bytes, what="torchmem.leak_check: max_leaked_bytes")
        self.devices = _normalize_devices(devices)
        self.cycles = cycle_policy.normalize_policy(cycles)
        self.cycle_repeats = cycle_policy.normalize_repeats(cycle_repeats)
        self.allowed_roots = _normalize_held_by(allow_held_by)
        self.entries = 0
        self.report: LeakReport | None = None
        self._open: _OpenCheck | None = None

    def __repr__(self) -> str:
        state = "open" if self._open is not None else "closed"
        return f"<torchmem.leak_check {state}, {self.entries} entries, warmup={self.warmup}>"

    # --- entering and leaving -------------------------------------------------------
    def __enter__(self) -> LeakReport:
        return self._enter(site=_caller_site(2))

    def _enter(self, site: str) -> LeakReport:
        if self._open is not None:
            if self._open.thread == threading.get_ident():
                raise RuntimeError(
                    f"torchmem.leak_check: this check is already open (entered at {self._open.site}) and cannot "
                    "be re-entered; nest a new torchmem.leak_check() instead"
                )
            raise RuntimeError(
                f"torchmem.leak_check: this check is open on another thread (entered at {self._open.site}); "
                "create one leak_check per thread"
            )
        _served_or_refuse(self.devices)
        # CUDA memory PyTorch's own allocator holds now: what it holds more at exit was
        # allocated inside, where this check cannot see (said in the report, never "no leaks").
        if self.devices is None or any(not name.startswith("cpu") for name in self.devices):
            unseen_cuda_start = _native_cuda_bytes()
        else:
            unseen_cuda_start = None
        self.entries += 1
        report = LeakReport(
            entry=self.entries, warmup=self.entries <= self.warmup, max_leaked_bytes=self.max_leaked_bytes,
            cycle_policy=self.cycles if self.cycles != cycle_policy.REPEATING
            else f"{self.cycles} ({self.cycle_repeats})",
        )
        capture = None
        if self.capture_stacks:
            capture = stack_capture.capturing()
            capture.__enter__()
        try:
            scope = _C.open_scope()
        except BaseException:
            if capture is not None:
                capture.__exit__(None, None, None)
            raise
        entry = _OpenCheck(scope=scope, thread=threading.get_ident(), report=report, site=site, capture=capture,
                           unseen_cuda_start=unseen_cuda_start)
        self._open = entry
        _thread_stack().append(entry)
        with _open_checks_lock:
            _open_checks.append(entry)
        return report

    def __exit__(self, exc_type, exc, traceback) -> bool:
        collector.pause_automatic_collections()  # first: see collector's note
        try:
            return self._exit(exc_type, exc)
        finally:
            collector.resume_automatic_collections()

    def _exit(self, exc_type, exc) -> bool:
        entry = self._validated_open_entry()
        try:
            survivors = _C.close_scope(entry.scope)
        except (RuntimeError, ValueError) as error:
            if _C.is_scope_open(entry.scope):  # nothing changed: the user can fix and exit again
                raise RuntimeError(
                    f"torchmem.leak_check (entered at {entry.site}) cannot close its scope: {error}; a scope "
                    "opened inside it directly with torchmem._C.open_scope is still open: close that first"
                ) from error
            self._unregister(entry)
            raise RuntimeError(
                f"torchmem.leak_check (entered at {entry.site}): its scope was already closed, by a direct "
                "torchmem._C.close_scope call; leave leak-check scopes to leak_check"
            ) from error
        self._unregister(entry)
        report = entry.report
        self.report = report
        if exc_type is not None:
            # The traceback keeps the failing frames' locals alive: whatever is left would
            # be noise, and the original error matters more.
            report.aborted = f"{exc_type.__name__}: {exc}"
            return False
        Classifier(self, entry, survivors).run()
        self._note_unseen(entry)
        report.finished = True
        if self.raise_on_leak and not report.warmup and report.exceeds_limit:
            raise LeakError(report)
        return False

    def _note_unseen(self, entry: _OpenCheck) -> None:
        """Says so (report and warning) when CUDA memory allocated inside is still allocated
        by PyTorch's own allocator, which this check cannot see."""
        if entry.unseen_cuda_start is None:
            return
        now = _native_cuda_bytes()
        if not now:
            return
        grown = {index: size - entry.unseen_cuda_start.get(index, 0) for index, size in now.items()}
        grown = {index: size for index, size in grown.items() if size > 0}
        if not grown:
            return
        where = ", ".join(f"cuda:{index}" for index in sorted(grown))
        entry.report.unseen = (
            f"{format_bytes(sum(grown.values()))} of CUDA memory ({where}) allocated inside is still allocated by "
            f"PyTorch's own allocator, which this check cannot see (torchmem serves only "
            f"{', '.join(_install.installed_devices())}): {_INSTALL_HINT}"
        )
        warnings.warn(f"torchmem.leak_check (entered at {entry.site}): {entry.report.unseen}", UnseenMemoryWarning,
                      stacklevel=4)

    def _validated_open_entry(self) -> _OpenCheck:
        """The entry an exit closes; raises (changing nothing) if this exit is misplaced."""
        entry = self._open
        if entry is None:
            raise RuntimeError(
                "torchmem.leak_check: exited without a matching enter (exited twice, or never entered); "
                "use it as `with torchmem.leak_check():` or as a decorator"
            )
        if entry.thread != threading.get_ident():
            raise RuntimeError(
                f"torchmem.leak_check: entered on another thread (at {entry.site}); exit it on the thread "
                "that entered it"
            )
        stack = _thread_stack()
        if not stack or stack[-1] is not entry:
            inner = stack[-1].site if stack else "unknown"
            raise RuntimeError(
                f"torchmem.leak_check: exited out of order: the check entered at {entry.site} still has a "
                f"check open inside it (entered at {inner}); exit the inner check first (with-blocks nest "
                "correctly)"
            )
        return entry

    def _unregister(self, entry: _OpenCheck) -> None:
        """Forgets the open entry and stops the stack capture it started."""
        _thread_stack().pop()
        self._open = None
        with _open_checks_lock:
            _open_checks.remove(entry)
        if entry.capture is not None:
            entry.capture.__exit__(None, None, None)

    # --- for wrappers (torchmem.distributed's collective check) ------------------------
    @property
    def is_open(self) -> bool:
        """True while an entry of this check is open (between its enter and exit)."""
        return self._open is not None

    def enter(self, site: str | None = None) -> LeakReport:
        """Opens an entry, as ``with`` does; ``site`` is what reports and errors call the
        place it was entered (default: the caller's file and line). For code that wraps a
        check: ``torchmem.distributed.leak_check`` enters its rank's check with it."""
        return self._enter(site=site if site is not None else _caller_site(2))

    def allow_returned(self, result, *, yielded: bool = False) -> None:
        """Allows what ``result`` holds to outlive the entry open on this thread, as the
        decorator does with what a function returns: tensors in it at any nesting depth
        (tuples, named tuples, lists, sets, dicts, dataclasses), and anything held only
        through it (an object holding tensors: the owner search starts at ``result``).
        ``yielded``: ``result`` is an item a generator yielded. Does nothing when no entry is
        open on this thread."""
        entry = self._open
        if entry is None or entry.thread != threading.get_ident():
            return
        identities = entry.yielded if yielded else entry.returned
        for tensor in _returned_tensors(result):
            identity = _block_identity(tensor)
            if identity is not None:
                identities.add(identity)
        note = "yielded by the checked generator" if yielded else "returned by the checked function"
        entry.allowed_roots += (_owners.AllowedRoot("result", result, f"held only through result, {note}"),)

    # --- decorator ------------------------------------------------------------------
    def __call__(self, func):
        """Checks every call of ``func``; what it returns is allowed to survive.

        Coroutine functions (``async def``) are checked while the coroutine runs, from its
        first step to its return; generator functions from the first item asked for to
        their exhaustion or ``close()``, what they yield being allowed like a return value
        (what the consuming loop keeps between items is allocated inside, and counts).
        """
        if not callable(func):
            raise TypeError(
                f"torchmem.leak_check(...) decorates a function, got {type(func).__name__}; "
                "write @torchmem.leak_check() (with parentheses) or use it in a with-statement"
            )
        if inspect.isasyncgenfunction(func):
            raise TypeError(
                f"torchmem.leak_check() cannot decorate the async generator {func.__qualname__}: its items are "
                "produced across awaits of the consumer; use `with torchmem.leak_check():` around the code that "
                "consumes it, or inside it"
            )
        if inspect.iscoroutinefunction(func):
            return self._checked_coroutine(func)
        if inspect.isgeneratorfunction(func):
            return self._checked_generator(func)

        @functools.wraps(func)
        def checked(*args, **kwargs):
            entry = self._open
            if entry is not None and entry.thread == threading.get_ident():
                return func(*args, **kwargs)  # a recursive call: the outer call's check covers it
            self._enter(site=_caller_site(2))
            try:
                result = func(*args, **kwargs)
            except BaseException:
                if not self.__exit__(*sys.exc_info()):
                    raise
                return None
            self.allow_returned(result)
            self.__exit__(None, None, None)
            return result

        return checked

    def _checked_coroutine(self, func):
        site = _definition_site(func)

        @functools.wraps(func)
        async def checked(*args, **kwargs):
            entry = self._open
            if entry is not None and entry.thread == threading.get_ident():
                return await func(*args, **kwargs)  # awaited inside its own check
            self._enter(site=site)
            try:
                result = await func(*args, **kwargs)
            except BaseException:
                if not self.__exit__(*sys.exc_info()):
                    raise
                return None
            self.allow_returned(result)
            self.__exit__(None, None, None)
            return result

        return checked

    def _checked_generator(self, func):
        site = _definition_site(func)

        @functools.wraps(func)
        def checked(*args, **kwargs):
            entry = self._open
            if entry is not None and entry.thread == threading.get_ident():
                return (yield from func(*args, **kwargs))  # iterated inside its own check
            self._enter(site=site)
            try:
                generator = func(*args, **kwargs)
                item = next(generator)
                while True:
                    self.allow_returned(item, yielded=True)
                    try:
                        sent = yield item
                    except GeneratorExit:  # closed before its end: check what it left so far
                        del item
                        generator.close()
                        break
                    except BaseException as error:  # thrown in: the generator decides
                        del item  # not kept while the next one is made
                        item = generator.throw(error)
                    else:
                        del item
                        item = generator.send(sent)
            except StopIteration as stop:
                result = stop.value
            except BaseException:
                if not self.__exit__(*sys.exc_info()):
                    raise
                return None
            else:
                result = None  # closed early
            self.allow_returned(result)
            self.__exit__(None, None, None)
            return result

        return checked


def _definition_site(func) -> str:
    """``file:line (qualname)`` of a function: where a coroutine or generator check is entered
    from cannot be told (its first step runs from an event loop or a for-loop)."""
    code = getattr(func, "__code__", None)
    name = getattr(func, "__qualname__", repr(func))
    return f"{short_path(code.co_filename)}:{code.co_firstlineno} ({name})" if code is not None else name
