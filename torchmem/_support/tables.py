"""Text tables for reports, laid out by ``rich`` and returned as plain strings.

Reports return text (``summary()``, ``RssReport.render()``, ...) that callers print,
log, or put in a test failure: so a table here is rendered once into a string without
colour codes and without wrapping, whatever the terminal is. ``rich`` does the layout
(column widths, alignment, wide characters); this module fixes the style every report
shares: no borders, a header row, two spaces between columns, the given indent.

    rows = [["cpu", "1.0 MiB"], ["cuda:0", "2.0 GiB"]]
    print(render_table(["device", "peak"], rows, justify=["left", "right"]))
"""

from __future__ import annotations

import io
from typing import Iterable, Sequence

from rich.console import Console
from rich.table import Table

__all__ = ["render_table", "render_rows"]

# Wide enough that no report line is ever wrapped: a report's lines are as long as
# their content, and readers (terminals, log viewers, pytest) wrap as they like.
_NO_WRAP_WIDTH = 10_000


def _console() -> Console:
    return Console(
        file=io.StringIO(),
        width=_NO_WRAP_WIDTH,
        color_system=None,
        force_terminal=False,
        force_jupyter=False,
        highlight=False,
        emoji=False,
        markup=False,
        legacy_windows=False,
    )


def _to_text(table: Table, indent: str) -> str:
    console = _console()
    console.print(table, crop=False)
    lines = console.file.getvalue().splitlines()
    return "\n".join((indent + line).rstrip() for line in lines if line.strip())


def render_table(
    header: Sequence[str] | None,
    rows: Iterable[Sequence[str]],
    *,
    justify: Sequence[str] | None = None,
    indent: str = "  ",
    gap: int = 3,
) -> str:
    """Rows of strings as aligned columns; ``header`` first when given (``None``: none).

    ``justify``: per column ``"left"`` or ``"right"`` (default: the first column left, the
    others right, as numbers read). ``gap``: spaces between columns.
    """
    rows = [list(map(str, row)) for row in rows]
    columns = len(header) if header is not None else (len(rows[0]) if rows else 0)
    if justify is None:
        justify = ["left"] + ["right"] * (columns - 1)
    table = Table(
        box=None,  # no rules: reports are read in logs, where lines of dashes are noise
        show_header=header is not None,
        show_edge=False,
        pad_edge=False,
        # Every column carries the gap on its right; the last one's is stripped with the line.
        padding=(0, gap, 0, 0),
        header_style=None,
    )
    for index in range(columns):
        name = header[index] if header is not None else ""
        table.add_column(
            name,
            justify=justify[index],
            no_wrap=True,
            style=None,
            header_style=None,
        )
    for row in rows:
        table.add_row(*row)
    return _to_text(table, indent)


def render_rows(rows: Iterable[Sequence[str]], **kwargs) -> str:
    """:func:`render_table` without a header row."""
    return render_table(None, rows, **kwargs)
