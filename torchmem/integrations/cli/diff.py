"""``torchmem diff``: what changed between two captures, by allocation site or by tag, like
``tracemalloc.Snapshot.compare_to``.

    torchmem diff before.tmem after.tmem              # live memory per allocation line, biggest change first
    torchmem diff before.tmem after.tmem --by tag
"""

from __future__ import annotations

import argparse
import json
import sys

from torchmem._support.validate import argparse_int
from torchmem.integrations.cli import captures

NAME = "diff"
HELP = "compare two saved captures: live memory per allocation site or per tag, biggest change first"


def add_parser(commands, prog: str) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        NAME, help=HELP,
        description="Live memory (blocks alive when each capture was taken) of NEW against OLD, per allocation "
        "site (file, line, function) or per tag, biggest change first; unchanged entries are left out.",
    )
    parser.add_argument("old", metavar="OLD", help="the capture to compare against (.tmem)")
    parser.add_argument("new", metavar="NEW", help="the later capture (.tmem)")
    parser.add_argument("--by", choices=("site", "tag"), default="site", help="group by allocation site (default) or tag")
    parser.add_argument("--top", metavar="N", type=argparse_int(minimum=1), default=20,
                        help="changes listed (default 20)")
    parser.add_argument("--json", action="store_true", help="print every difference as JSON")
    return parser


def execute(args: argparse.Namespace, prog: str) -> int:
    from torchmem.reports import diff

    try:
        old = captures.load([args.old])
        new = captures.load([args.new])
    except captures.Unreadable as error:
        print(f"{prog} {NAME}: {error}", file=sys.stderr)
        return captures.EXIT_UNREADABLE
    differences = new.compare_to(old, args.by)
    if args.json:
        print(json.dumps([d.to_dict() for d in differences if d.size_diff or d.count_diff], indent=2))
    else:
        print(diff.render(differences, args.by, args.old, args.new, top=args.top))
    return 0
