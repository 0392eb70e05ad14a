"""``torchmem stats``: a saved capture's allocation statistics, like ``memray stats``.

    torchmem stats torchmem-train.1234.tmem          # per device: counts, sizes, the busiest lines
    torchmem stats torchmem-train.1234.tmem --json
"""

from __future__ import annotations

import argparse
import json
import sys

from torchmem._support.validate import argparse_int
from torchmem.integrations.cli import captures

NAME = "stats"
HELP = "allocation statistics of a saved capture: counts, sizes, the lines that allocated most"


def add_parser(commands, prog: str) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        NAME, help=HELP,
        description="Per device: allocations and frees in the capture's trace, bytes allocated, peak and current "
        "memory in use, allocations by size, and the lines that allocated most often and the most bytes.",
    )
    parser.add_argument("captures", nargs="+", metavar="CAPTURE", help="a .tmem file (several: the ranks of a job)")
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON")
    parser.add_argument("--top", metavar="N", type=argparse_int(minimum=1), default=5,
                        help="lines listed per table (default 5)")
    return parser


def execute(args: argparse.Namespace, prog: str) -> int:
    from torchmem._support import progress
    from torchmem.reports import stats

    try:
        capture = captures.load(args.captures)
    except captures.Unreadable as error:
        print(f"{prog} {NAME}: {error}", file=sys.stderr)
        return captures.EXIT_UNREADABLE
    with progress.step("counting the trace"):
        if args.json:
            output = json.dumps(stats.stats_dict(capture, top=args.top), indent=2)
        else:
            output = stats.render_stats(capture, top=args.top)
    print(output)
    return 0
