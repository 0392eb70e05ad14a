"""Host RAM per process: is RSS growth a leak, memory-mapped pages, or copy-on-write?

``torchmem.memory_stats("cpu")`` says what torchmem's allocator holds. The operating
system's figure people watch is the resident set size (RSS), and RSS grows for reasons
that are not leaks. ``rss_report()`` splits the RSS of this process and of each of its
children (DataLoader workers are children) into what caused it::

    print(torchmem.rss_report().render())

    monitor = torchmem.RssMonitor()          # growth per process, in a loop
    for epoch in range(epochs):
        train_one_epoch()
        print(monitor.sample().render())     # change since the previous sample

Every resident page of a process is in exactly one of four parts (read from
``/proc/<pid>/smaps`` through psutil's ``memory_maps()``):

``private``
    anonymous memory (heap, ``malloc``, tensors, Python objects) that only this process
    maps. A leak grows this, and so does any cache that is still filling.
``shared_anonymous``
    anonymous memory this process still shares with another one: after ``fork()`` a
    DataLoader worker shares its parent's whole heap, copy-on-write. When the worker
    writes to an inherited page (updating a Python reference count is a write), the kernel
    copies it: the page moves from ``shared_anonymous`` to ``private`` and the RSS does not
    change. That move is the "copy-on-write in workers" growth.
``file_backed``
    pages of mapped files: shared libraries, and memory-mapped datasets (``np.memmap``,
    ``mmap``, safetensors, Arrow). They are the kernel's page cache, which it can drop
    and reread at any time: RSS growth from reading a mapped file is not a leak.
``shmem``
    shared memory (``/dev/shm``, memfd): PyTorch moves every batch a DataLoader worker
    produces into shared memory to hand it to the main process.

psutil's own figures are kept too: ``uss`` (pages only this process maps), ``pss``
(each page divided by the number of processes mapping it) and ``swap``, and
``shared = rss - uss``. Note that USS alone cannot tell a leak from a mapped file: a
file page that no other process maps counts as private, so a memory-mapped dataset read
by one process raises its USS. That is why the report splits by anonymous / file-backed
first.

For the calling process the report adds torchmem's CPU engine figures (allocated and
reserved bytes), which live inside ``private``: if ``private`` grows and torchmem's
``reserved`` grows with it, tensors are accumulating (``torchmem.leak_check`` and
``torchmem.GrowthMonitor`` say which); if ``private`` grows and torchmem's figures do
not, the memory is Python objects or another allocator's.

Pinned host memory (``pin_memory=True``, ``tensor.pin_memory()``) comes from PyTorch's
own pinned-memory allocator, not from torchmem: it appears in ``private`` and not in
torchmem's figures.

Reading a process's page map costs about 10-30 ms (more for processes with thousands of
mappings): fine at epoch boundaries or every few hundred steps, too slow for every step.
Linux only (``/proc``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from torchmem._support.tables import render_table
from torchmem._support.units import format_bytes
from torchmem._support.validate import require_int

__all__ = ["ProcessMemory", "RssReport", "ProcessDelta", "RssDelta", "RssMonitor", "rss_report", "rss_delta"]

# The four parts of the RSS, in the order reports show them.
PARTS = ("private", "shared_anonymous", "file_backed", "shmem")

# Changes smaller than this are noise (malloc arenas, the interpreter's own caches, the
# report's own work: a few MiB between two reports of an idle Python process) and are not
# called out by a delta's explanation.
DEFAULT_THRESHOLD = 4 << 20

# Path prefixes of shared-memory mappings in /proc/<pid>/smaps.
_SHMEM_PREFIXES = ("/dev/shm/", "/memfd:", "/SYSV", "/dev/zero")

# Process names PyTorch gives its DataLoader workers (torch.multiprocessing._set_thread_name
# names the worker's main thread, which is the process name on Linux).
_WORKER_NAMES = ("pt_data_worker",)


def _psutil():
    try:
        import psutil
    except ImportError as error:  # pragma: no cover - psutil is a dependency of torchmem
        raise RuntimeError(
            "torchmem.rss_report needs psutil (a torchmem dependency): pip install psutil"
        ) from error
    return psutil


# --- one process --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessMemory:
    """The resident memory of one process, in bytes.

    ``private + shared_anonymous + file_backed + shmem`` is the RSS as the page map counts
    it (``rss`` is the kernel's counter read a moment earlier; they differ by the pages
    touched in between). ``pss`` and ``swap`` are None where the kernel does not report them.
    """

    pid: int
    role: str  # "main" (the process that made the report), "DataLoader worker", "child", ...
    name: str
    rss: int
    uss: int
    pss: int | None
    swap: int | None
    private: int
    shared_anonymous: int
    file_backed: int
    shmem: int

    @property
    def shared(self) -> int:
        """Resident pages some other process maps too (``rss - uss``)."""
        return max(self.rss - self.uss, 0)

    def to_dict(self) -> dict:
        """Plain data for JSON, ``shared`` included."""
        data = asdict(self)
        data["shared"] = self.shared
        return data


def _split_page_map(maps) -> dict[str, int]:
    """The four parts of the RSS from psutil's ``memory_maps(grouped=True)`` rows.

    A row is anonymous memory (no path, or a ``[heap]``/``[stack]``/``[anon:...]`` pseudo
    path), shared memory, or a mapped file. A mapped file's row can hold anonymous pages
    too: pages of a private file mapping the process wrote to (a library's data section)
    are copies, counted as anonymous; they are private unless a fork still shares them.
    """
    parts = dict.fromkeys(PARTS, 0)
    for row in maps:
        path = row.path or ""
        private = row.private_clean + row.private_dirty
        shared = row.shared_clean + row.shared_dirty
        if not path.startswith("/"):
            parts["private"] += private
            parts["shared_anonymous"] += shared
        elif path.startswith(_SHMEM_PREFIXES):
            parts["shmem"] += row.rss
        else:
            anonymous = min(row.anonymous, row.rss)
            # Written pages of a private file mapping are dirty; those still shared after a
            # fork are the rest of the row's anonymous pages.
            private_anonymous = min(anonymous, row.private_dirty)
            parts["private"] += private_anonymous
            parts["shared_anonymous"] += anonymous - private_anonymous
            parts["file_backed"] += row.rss - anonymous
    return parts


def _role(process, main_pid: int) -> str:
    if process.pid == main_pid:
        return "main"
    try:
        name = process.name()
        cmdline = " ".join(process.cmdline())
    except Exception:  # noqa: BLE001 - the role is a label; the figures matter
        return "child"
    if name in _WORKER_NAMES:
        return "DataLoader worker"
    if "multiprocessing.resource_tracker" in cmdline:
        return "resource tracker"
    if "multiprocessing.forkserver" in cmdline:
        return "forkserver"
    return "child"


def _measure(process, main_pid: int) -> ProcessMemory:
    """Raises psutil.NoSuchProcess (and its ZombieProcess) if the process has gone."""
    info = process.memory_full_info()
    parts = _split_page_map(process.memory_maps(grouped=True))
    try:
        name = process.name()
    except Exception:  # noqa: BLE001
        name = "?"
    return ProcessMemory(
        pid=process.pid,
        role=_role(process, main_pid),
        name=name,
        rss=info.rss,
        uss=info.uss,
        pss=getattr(info, "pss", None),
        swap=getattr(info, "swap", None),
        **parts,
    )


# --- a report -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RssReport:
    """Resident memory of a process and its children at one moment.

    ``processes[0]`` is the process that made the report; then its children by pid.
    ``torchmem_cpu`` holds torchmem's CPU engine figures for that process
    (``installed``, ``allocated``, ``reserved``, ``cached`` = reserved - allocated): they
    are part of its ``private`` memory. ``unreadable`` lists pids (children) whose memory
    could not be read (no permission).
    """

    time: float
    processes: tuple[ProcessMemory, ...]
    torchmem_cpu: dict
    unreadable: tuple[int, ...] = ()

    @property
    def main(self) -> ProcessMemory:
        """The process that made the report."""
        return self.processes[0]

    @property
    def children(self) -> tuple[ProcessMemory, ...]:
        return self.processes[1:]

    def process(self, pid: int) -> ProcessMemory:
        """The entry for ``pid``; KeyError naming the pids present if it is not there."""
        for entry in self.processes:
            if entry.pid == pid:
                return entry
        raise KeyError(f"pid {pid} is not in this report (processes: {[p.pid for p in self.processes]})")

    def total(self, part: str) -> int:
        """``part`` (``"rss"``, ``"private"``, ...) summed over every process. Summing
        ``rss`` or ``shared_anonymous`` counts pages shared by several processes several
        times; ``private`` and ``pss`` add up honestly."""
        if part not in ("rss", "uss", "pss", "swap", "shared", *PARTS):
            raise ValueError(f"RssReport.total: unknown part {part!r}; use rss, uss, pss, swap, shared or {PARTS}")
        return sum(getattr(entry, part) or 0 for entry in self.processes)

    def to_dict(self) -> dict:
        """Plain data: every process's figures, torchmem's, and the time (``time.time()``)."""
        return {
            "time": self.time,
            "processes": [entry.to_dict() for entry in self.processes],
            "torchmem_cpu": dict(self.torchmem_cpu),
            "unreadable": list(self.unreadable),
        }

    def to_json(self, **kwargs) -> str:
        kwargs.setdefault("indent", 2)
        return json.dumps(self.to_dict(), **kwargs)

    def render(self) -> str:
        """A table: one row per process, the RSS and its parts, then what they mean."""
        header = ("pid", "process", "rss", "private", "shared-anon", "file-backed", "shmem", "uss", "pss")
        rows = []
        for entry in self.processes:
            rows.append((
                str(entry.pid),
                f"{entry.role} ({entry.name})" if entry.role != entry.name else entry.role,
                *(format_bytes(getattr(entry, key)) for key in ("rss", *PARTS, "uss")),
                "-" if entry.pss is None else format_bytes(entry.pss),
            ))
        lines = [f"torchmem.rss_report: host memory (RSS) of {len(self.processes)} process(es)"]
        justify = ["right", "left"] + ["right"] * (len(header) - 2)
        lines.append(render_table(header, rows, justify=justify, gap=2))
        if self.unreadable:
            lines.append(f"  (could not read pids {', '.join(map(str, self.unreadable))}: permission denied)")
        lines.append("  " + _torchmem_line(self.torchmem_cpu, self.main))
        lines.append(_LEGEND)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


_LEGEND = (
    "  private      anonymous memory only this process maps (heap, tensors, Python objects): leaks grow it\n"
    "  shared-anon  anonymous memory shared with another process: a forked worker's inherited heap\n"
    "               (copy-on-write: it turns private as the worker writes to it; RSS does not change)\n"
    "  file-backed  mapped files (libraries, memory-mapped datasets): page cache the kernel can drop,\n"
    "               not a leak\n"
    "  shmem        shared memory (/dev/shm): DataLoader batches on their way to the main process\n"
    "  uss = pages only this process maps (file pages included), pss = proportional share"
)


def _torchmem_line(figures: dict, main: ProcessMemory) -> str:
    if not figures.get("installed"):
        state = "not installed for CPU tensors (torchmem.install('cpu'))"
    else:
        state = "installed"
    return (
        f"torchmem CPU engine (pid {main.pid}, {state}): allocated {format_bytes(figures['allocated'])}, "
        f"reserved {format_bytes(figures['reserved'])} (cached {format_bytes(figures['cached'])}); "
        "part of 'private'"
    )


def _torchmem_figures() -> dict:
    from torchmem import _C

    stats = _C.cpu_engine().memory_stats()
    allocated = int(stats["allocated_bytes.all.current"])
    reserved = int(stats["reserved_bytes.all.current"])
    return {
        "installed": bool(_C.cpu_installed()),
        "allocated": allocated,
        "reserved": reserved,
        "cached": reserved - allocated,
    }


def rss_report(children: bool = True) -> RssReport:
    """Resident memory of this process and (with ``children``) of every descendant process:
    DataLoader workers, ``multiprocessing`` children, the resource tracker.

    Each process's RSS is split into ``private``, ``shared_anonymous``, ``file_backed`` and
    ``shmem`` (see the module documentation); this process's entry comes with torchmem's
    CPU engine figures. Children that exit while being read are left out.
    """
    if not isinstance(children, bool):
        raise TypeError(f"torchmem.rss_report: children must be True or False, got {children!r}")
    psutil = _psutil()
    me = psutil.Process()
    # torchmem's figures first, then the page maps: reading a page map allocates nothing
    # through torchmem, so the figures stay those of the moment the report was asked for.
    figures = _torchmem_figures()
    processes = [_measure(me, me.pid)]
    unreadable = []
    if children:
        for child in sorted(me.children(recursive=True), key=lambda process: process.pid):
            try:
                processes.append(_measure(child, me.pid))
            except psutil.NoSuchProcess:  # exited (or a zombie) since it was listed
                continue
            except psutil.AccessDenied:  # a setuid child, say: its page map is not ours to read
                unreadable.append(child.pid)
    return RssReport(time=time.time(), processes=tuple(processes), torchmem_cpu=figures, unreadable=tuple(unreadable))


# --- changes between two reports ----------------------------------------------------------------


@dataclass(frozen=True)
class ProcessDelta:
    """How one process's resident memory changed between two reports, in bytes.

    ``status`` is ``"both"`` (in both reports), ``"new"`` (started since: the change is its
    whole memory) or ``"exited"`` (gone since: the change is minus its memory).
    Pages can change hands between ``private`` and ``shared_anonymous`` without being
    allocated or freed: ``copy_on_write`` is the part of the ``private`` growth that came
    from ``shared_anonymous`` (shared pages that became this process's own), and
    ``became_shared`` the part of the ``private`` shrinkage that went there (this
    process's pages now shared with a child it forked since). ``new_private`` is the rest:
    memory the process newly allocated (or, negative, released).
    """

    pid: int
    role: str
    name: str
    status: str
    rss: int
    uss: int
    private: int
    shared_anonymous: int
    file_backed: int
    shmem: int
    copy_on_write: int
    became_shared: int
    new_private: int

    def explain(self, threshold: int = DEFAULT_THRESHOLD) -> list[str]:
        """One sentence per part that moved by at least ``threshold`` bytes, largest first."""
        causes = []
        if self.new_private >= threshold:
            causes.append((self.new_private, f"{_signed(self.new_private)} private: new memory in this process "
                                              "(a leak, or a cache still filling)"))
        elif self.new_private <= -threshold:
            causes.append((-self.new_private, f"{_signed(self.new_private)} private: memory freed"))
        if self.became_shared >= threshold:
            causes.append((self.became_shared, f"{_signed(self.became_shared)} became shared: this process's pages "
                                                "are now shared with another one (it forked, e.g. DataLoader "
                                                "workers); neither new nor freed"))
        if self.copy_on_write >= threshold:
            causes.append((self.copy_on_write, f"{_signed(self.copy_on_write)} copy-on-write: pages shared with "
                                                "another process became this one's own (one of the two wrote to "
                                                "them, or the other process exited); not new memory"))
        shared_only = self.shared_anonymous + self.copy_on_write - self.became_shared
        if abs(shared_only) >= threshold:
            causes.append((abs(shared_only), f"{_signed(shared_only)} shared-anon: memory shared with another "
                                             "process"))
        if abs(self.file_backed) >= threshold:
            causes.append((abs(self.file_backed), f"{_signed(self.file_backed)} file-backed: pages of mapped files "
                                                  "(memory-mapped data, libraries): page cache, not a leak"))
        if abs(self.shmem) >= threshold:
            causes.append((abs(self.shmem), f"{_signed(self.shmem)} shmem: shared memory (DataLoader batches "
                                            "in flight)"))
        return [text for _, text in sorted(causes, key=lambda cause: -cause[0])]

    def to_dict(self) -> dict:
        return asdict(self)


def _signed(size: int) -> str:
    return ("+" if size >= 0 else "-") + format_bytes(abs(size))


def _process_delta(before: ProcessMemory | None, after: ProcessMemory | None) -> ProcessDelta:
    zero = dict.fromkeys(("rss", "uss", *PARTS), 0)
    old = zero if before is None else {key: getattr(before, key) for key in zero}
    new = zero if after is None else {key: getattr(after, key) for key in zero}
    change = {key: new[key] - old[key] for key in zero}
    # Private growth matched by a shrinking shared-anonymous part is the same pages
    # changing hands (copy-on-write), not new memory; private shrinkage matched by a
    # growing shared part is pages a fork now shares, not freed memory.
    copy_on_write = became_shared = 0
    if change["private"] > 0 and change["shared_anonymous"] < 0:
        copy_on_write = min(change["private"], -change["shared_anonymous"])
    elif change["private"] < 0 and change["shared_anonymous"] > 0:
        became_shared = min(-change["private"], change["shared_anonymous"])
    label = after if after is not None else before
    return ProcessDelta(
        pid=label.pid,
        role=label.role,
        name=label.name,
        status="both" if before is not None and after is not None else ("new" if before is None else "exited"),
        copy_on_write=copy_on_write,
        became_shared=became_shared,
        new_private=change["private"] - copy_on_write + became_shared,
        **change,
    )


@dataclass(frozen=True)
class RssDelta:
    """The change from one ``RssReport`` to a later one, per process (matched by pid),
    with torchmem's CPU engine change for the reporting process (``torchmem_cpu``:
    ``allocated`` and ``reserved`` deltas)."""

    seconds: float
    processes: tuple[ProcessDelta, ...]
    torchmem_cpu: dict
    main_pid: int
    threshold: int = DEFAULT_THRESHOLD

    def process(self, pid: int) -> ProcessDelta:
        for entry in self.processes:
            if entry.pid == pid:
                return entry
        raise KeyError(f"pid {pid} is in neither report (processes: {[p.pid for p in self.processes]})")

    @property
    def main(self) -> ProcessDelta:
        return self.process(self.main_pid)

    def to_dict(self) -> dict:
        return {
            "seconds": self.seconds,
            "threshold": self.threshold,
            "main_pid": self.main_pid,
            "processes": [entry.to_dict() for entry in self.processes],
            "torchmem_cpu": dict(self.torchmem_cpu),
        }

    def to_json(self, **kwargs) -> str:
        kwargs.setdefault("indent", 2)
        return json.dumps(self.to_dict(), **kwargs)

    def render(self, title: str = "torchmem.rss_delta: change in host memory") -> str:
        """Per process: the RSS change and what caused it; then whether the main process's
        private growth is torchmem's tensors. ``title`` starts the first line."""
        lines = [f"{title} over {self.seconds:.1f} s"]
        for entry in self.processes:
            what = f"{entry.pid} {entry.role}" + (f" ({entry.name})" if entry.name != entry.role else "")
            status = {"new": " (started since)", "exited": " (exited since)"}.get(entry.status, "")
            lines.append(f"  {what}{status}: rss {_signed(entry.rss)}, private {_signed(entry.private)}")
            causes = entry.explain(self.threshold)
            for cause in causes:
                lines.append(f"      {cause}")
            if not causes:
                lines.append(f"      no change of {format_bytes(self.threshold)} or more in any part")
        main = self.main
        allocated, reserved = self.torchmem_cpu["allocated"], self.torchmem_cpu["reserved"]
        lines.append(
            f"  torchmem CPU engine (pid {self.main_pid}): allocated {_signed(allocated)}, reserved {_signed(reserved)}"
        )
        if main.new_private >= self.threshold:
            if reserved >= main.new_private / 2:
                lines.append("      the main process's new private memory is mostly torchmem's cache: tensors "
                             "(torchmem.leak_check / torchmem.GrowthMonitor say which)")
            else:
                lines.append("      the main process's new private memory is not torchmem's tensors: Python objects, "
                             "pinned memory or another allocator")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


def rss_delta(before: RssReport, after: RssReport, threshold: int = DEFAULT_THRESHOLD) -> RssDelta:
    """What changed from ``before`` to ``after`` (two ``rss_report()`` results), per process.

    Processes are matched by pid; one in only one report is ``new`` or ``exited``.
    ``threshold`` (bytes) is the smallest change ``render()`` explains.
    """
    for which, report in (("before", before), ("after", after)):
        if not isinstance(report, RssReport):
            raise TypeError(f"torchmem.rss_delta: {which} must be an RssReport (from torchmem.rss_report()), "
                            f"got {type(report).__name__}")
    require_int(threshold, what="torchmem.rss_delta: threshold", minimum=0, meaning="bytes")
    if before.main.pid != after.main.pid:
        raise ValueError(
            f"torchmem.rss_delta: the reports come from different processes (pid {before.main.pid} and "
            f"{after.main.pid}); compare reports made by the same process"
        )
    old = {entry.pid: entry for entry in before.processes}
    new = {entry.pid: entry for entry in after.processes}
    pids = [entry.pid for entry in after.processes] + [pid for pid in old if pid not in new]
    return RssDelta(
        seconds=after.time - before.time,
        processes=tuple(_process_delta(old.get(pid), new.get(pid)) for pid in pids),
        torchmem_cpu={key: after.torchmem_cpu[key] - before.torchmem_cpu[key] for key in ("allocated", "reserved")},
        main_pid=after.main.pid,
        threshold=threshold,
    )


class RssMonitor:
    """Per-process RSS growth in a loop, split like ``rss_report``.

        monitor = torchmem.RssMonitor()
        for epoch in range(epochs):
            train_one_epoch()
            print(monitor.sample().render())   # change since the previous sample
        print(monitor.total().render())        # change since the monitor was made

    The first report is taken when the monitor is made. Only the first and the latest
    reports are kept, so a monitor in a loop of any length uses constant memory.
    """

    def __init__(self, children: bool = True, threshold: int = DEFAULT_THRESHOLD):
        require_int(threshold, what="torchmem.RssMonitor: threshold", minimum=0, meaning="bytes")
        self.children = children
        self.threshold = threshold
        self.first = rss_report(children=children)
        self.last = self.first
        self.samples = 0

    def sample(self) -> RssDelta:
        """Takes a report; returns the change since the previous one (or since the start)."""
        report = rss_report(children=self.children)
        delta = rss_delta(self.last, report, self.threshold)
        self.last = report
        self.samples += 1
        return delta

    def total(self) -> RssDelta:
        """The change from the first report to the latest sample."""
        return rss_delta(self.first, self.last, self.threshold)
