"""Capture files (``.tmem``): what a report needs, saved, so it can be rendered again later.

    torchmem.record_trace()                   # before the code to look at: the timeline
    ...
    torchmem.write_capture("train.tmem")      # everything a report shows, in one file
    capture = torchmem.load_capture("train.tmem")
    print(capture.render())                   # text; capture.to_json(); capture.write_html(path)
    for diff in capture.compare_to(torchmem.load_capture("before.tmem"), "site")[:10]:
        print(diff)

A capture is gzip-compressed JSON: safe to load from anywhere (no pickle), readable with
``zcat train.tmem | python -m json.tool``, and small (columns of integers compress well).
The layout is documented in ``docs/capture-format.md``; its first keys are always::

    {"format": "torchmem-capture", "version": "1.0", ...}

Versions. ``MAJOR.MINOR``: a reader reads every minor version of its major version
(readers ignore keys they do not know, and writers only add keys within a major version),
and refuses a newer major version with an error that says which torchmem reads it.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from typing import Any, Iterable

__all__ = [
    "FORMAT",
    "VERSION",
    "Capture",
    "CaptureFormatError",
    "write_capture",
    "load_capture",
    "combine_captures",
    "default_capture_path",
]

FORMAT = "torchmem-capture"
VERSION = (1, 0)
SUFFIX = ".tmem"
# Level 6 (gzip's default) takes 3x the time of level 1 for ~15 % smaller captures of
# traces: level 1 keeps writing a capture at exit or at an out-of-memory error quick.
_COMPRESS_LEVEL = 1


class CaptureFormatError(ValueError):
    """The file is not a torchmem capture, is damaged, or needs a newer torchmem."""


def version_string() -> str:
    return f"{VERSION[0]}.{VERSION[1]}"


def default_capture_path(name: str | None = None, pid: int | None = None) -> str:
    """``torchmem-<name>.<pid>.tmem`` in the working directory, as memray names its files
    (``name``: the script's name without directory or ``.py``; default ``python``)."""
    import sys

    if name is None:
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c", "-m") else "python"
        name = script[:-3] if script.endswith(".py") else script
    return f"torchmem-{name}.{os.getpid() if pid is None else pid}{SUFFIX}"


class Capture:
    """A capture in memory: the data of :func:`write_capture`, with readers for reports.

    ``data`` is the plain dict the file holds (see ``docs/capture-format.md``).
    """

    def __init__(self, data: dict, source: str | None = None):
        self.data = data
        self.source = source  # the file it was read from, if any

    # --- what it holds --------------------------------------------------------------------
    @property
    def meta(self) -> dict:
        return self.data.get("meta", {})

    @property
    def devices(self) -> dict:
        return self.data.get("devices", {})

    @property
    def ranks(self) -> list["Capture"]:
        """The captures of a job's ranks (a combined capture), else ``[]``."""
        return [Capture(rank, self.source) for rank in self.data.get("ranks") or []]

    @property
    def leaks(self) -> dict | None:
        return self.data.get("leaks")

    @property
    def oom(self) -> dict | None:
        return self.data.get("oom")

    @property
    def label(self) -> str:
        meta = self.meta
        label = meta.get("label") or " ".join(meta.get("argv") or []) or "python"
        if meta.get("rank") is not None:
            label += f" (rank {meta['rank']} of {meta.get('world_size')})"
        return label

    def stack(self, stack_id) -> list[dict]:
        """Frames of a stack id, innermost first: ``{"filename", "line", "name", "origin",
        "source"}`` each."""
        from torchmem.reports import sites

        return sites.frames_of(self.data, stack_id)

    # --- derived views ---------------------------------------------------------------------
    def sites(self, device: str | None = None, *, by: str = "live", limit: int | None = None) -> list:
        """Allocation sites, largest first, ``by`` ``"live"`` (bytes alive at the capture) or
        ``"peak"`` (the most each site held at once; needs the trace)."""
        from torchmem.reports import sites

        return sites.top_sites(self.data, device, by=by, limit=limit)

    def compare_to(self, old: "Capture", by: str = "site") -> list:
        """What changed since ``old``, like ``tracemalloc.Snapshot.compare_to``: a list of
        :class:`torchmem.reports.diff.Difference`, biggest change first; ``by`` ``"site"``
        (allocation line) or ``"tag"``."""
        from torchmem.reports import diff

        return diff.compare(old, self, by=by)

    def render(self, top: int = 10) -> str:
        """The capture as text: per device the summary, the top sites by live and peak
        bytes, categories and the leak findings."""
        from torchmem.reports import text

        return text.render_capture(self, top=top)

    def to_json(self, **kwargs) -> str:
        """The report's figures as JSON (summary, top sites, categories, leaks, OOM, ranks):
        what ``torchmem report --json`` writes, not the raw capture."""
        from torchmem.reports import text

        kwargs.setdefault("indent", 2)
        return json.dumps(text.report_dict(self), **kwargs)

    def write_html(self, path: str | os.PathLike) -> str:
        """The HTML report of this capture (:func:`torchmem.write_html`)."""
        from torchmem.reports import html

        return html.write_html(path, self)

    def write(self, path: str | os.PathLike) -> str:
        """Writes this capture to ``path`` (gzip JSON); returns the path."""
        return _write_file(self.data, path, what="torchmem.write_capture")


def _checked_output(path, what: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what}: path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{what}: {path!r} is a directory; give a file name")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{what}: cannot write {path!r}: the directory {directory!r} does not exist")
    return path


def _write_file(data: dict, path, *, what: str) -> str:
    path = _checked_output(path, what)
    # Encode first, write to a temporary beside it, then rename: a capture is either
    # complete or absent, never half written (an out-of-memory moment is a bad time to die
    # leaving a truncated file that looks like a capture).
    payload = encode(data)
    temporary = f"{path}.{os.getpid()}.partial"
    try:
        with open(temporary, "wb") as raw:
            raw.write(payload)
        os.replace(temporary, path)
    except OSError as error:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise type(error)(error.errno, f"{what}: cannot write {path!r} ({error.strerror})") from None
    return path


def write_capture(
    path: str | os.PathLike | None = None,
    *,
    leaks=None,
    oom_message: str | None = None,
    label: str | None = None,
    devices=None,
) -> str:
    """Writes what a report needs about this process now to ``path`` (default
    ``torchmem-<script>.<pid>.tmem``); returns the path.

    It holds: per device the summary, the trace recorded by ``torchmem.record_trace()``
    (the memory timeline) and its samples per tag and per category, the live blocks with
    their allocation stacks, category and module (``torchmem.track``), the cache's segments
    and their blocks, out-of-memory events; the stacks with their source lines; and the
    leak findings of ``leaks`` (a ``LeakReport``) when given. ``oom_message``: the text of
    an out-of-memory error to keep with it. Overwrites ``path``.
    """
    from torchmem.reports import collect

    data = collect.collect(leaks=leaks, oom_message=oom_message, label=label, devices=devices)
    return _write_file(data, path if path is not None else default_capture_path(), what="torchmem.write_capture")


def encode(data: dict) -> bytes:
    """A capture's data as the bytes of a ``.tmem`` file (gzip JSON)."""
    return gzip.compress(json.dumps(data, separators=(",", ":")).encode(), compresslevel=_COMPRESS_LEVEL, mtime=0)


def decode(raw: bytes, source: str) -> Capture:
    """The capture in ``raw`` (the bytes of a ``.tmem`` file, from :func:`encode`);
    :class:`CaptureFormatError` names ``source`` when they are not one this torchmem reads."""
    try:
        data = json.loads(gzip.decompress(raw))
    except (OSError, EOFError, zlib.error, ValueError, UnicodeDecodeError) as error:
        raise CaptureFormatError(f"torchmem.load_capture: {source} is damaged ({error})") from None
    check_version(data, source)
    return Capture(data)


def _read_file(path) -> dict:
    what = "torchmem.load_capture"
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what}: path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    try:
        with open(path, "rb") as file:
            head = file.read(2)
            file.seek(0)
            if head != b"\x1f\x8b":
                raise CaptureFormatError(
                    f"{what}: {path!r} is not a torchmem capture (not gzip data; captures are written by "
                    "torchmem.write_capture or torchmem run)"
                )
            raw = gzip.GzipFile(fileobj=file).read()
    except (OSError, EOFError, zlib.error) as error:
        if isinstance(error, (FileNotFoundError, IsADirectoryError, PermissionError)):
            raise
        raise CaptureFormatError(f"{what}: {path!r} is damaged (truncated or corrupt gzip data: {error})") from None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise CaptureFormatError(f"{what}: {path!r} is damaged (not valid JSON inside: {error})") from None
    return data


def check_version(data: Any, source: str) -> None:
    """Raises :class:`CaptureFormatError` unless ``data`` is a capture this torchmem reads."""
    what = "torchmem.load_capture"
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CaptureFormatError(f"{what}: {source} is not a torchmem capture (no \"format\": \"{FORMAT}\")")
    version = data.get("version")
    try:
        major, minor = (int(part) for part in str(version).split("."))
    except ValueError:
        raise CaptureFormatError(f"{what}: {source} has an unreadable format version {version!r}") from None
    if major > VERSION[0]:
        raise CaptureFormatError(
            f"{what}: {source} is capture format {major}.{minor}, newer than this torchmem "
            f"({_torchmem_version()}) reads (format {VERSION[0]}.x): upgrade torchmem to read it "
            "(pip install -U torchmem)"
        )
    if major < 1:
        raise CaptureFormatError(f"{what}: {source} has format version {version}, which no torchmem wrote")


def _torchmem_version() -> str:
    import torchmem

    return f"torchmem {torchmem.__version__}"


def load_capture(path: str | os.PathLike) -> Capture:
    """Reads a capture written by :func:`write_capture` (or ``torchmem run``).

    Raises ``FileNotFoundError`` for a missing file and :class:`CaptureFormatError` for a
    file that is not a capture, is damaged, or was written by a newer major version of
    the format (the message says what to do).
    """
    data = _read_file(path)
    check_version(data, repr(os.fspath(path)))
    for rank in data.get("ranks") or []:
        check_version(rank, f"{os.fspath(path)!r} (a rank inside)")
    return Capture(data, os.fspath(path))


def combine_captures(captures: Iterable, path: str | os.PathLike | None = None) -> Capture:
    """One capture of a distributed job from its ranks' captures (paths or ``Capture``
    objects), ordered by rank; written to ``path`` when given. Its report has a row per rank."""
    loaded = [capture if isinstance(capture, Capture) else load_capture(capture) for capture in captures]
    if not loaded:
        raise ValueError("torchmem.combine_captures: no captures given")
    ranks = []
    for capture in loaded:
        ranks.extend(capture.data["ranks"] if capture.data.get("ranks") else [capture.data])
    ranks.sort(key=lambda rank: (rank.get("meta", {}).get("rank") is None, rank.get("meta", {}).get("rank") or 0))
    first = ranks[0]
    combined = {
        "format": FORMAT,
        "version": version_string(),
        "meta": dict(first.get("meta", {}), rank=None),
        "devices": {},
        "stacks": {},
        "ranks": ranks,
    }
    result = Capture(combined)
    if path is not None:
        result.write(path)
        result.source = os.fspath(path)
    return result
