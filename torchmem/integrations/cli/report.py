"""``torchmem report``: a saved capture as text, JSON or the HTML report, without re-running.

    torchmem report torchmem-train.1234.tmem                  # text: summary, top sites, categories, leaks
    torchmem report torchmem-train.1234.tmem --html mem.html  # the HTML report
    torchmem report torchmem-train.1234.tmem --json           # the report's figures as JSON, on stdout
    torchmem report run.rank0.tmem run.rank1.tmem --html job.html   # a job: a row per rank
"""

from __future__ import annotations

import argparse
import sys

from torchmem._support.validate import argparse_int
from torchmem.integrations.cli import captures
from torchmem.integrations.cli.common import check_writable

NAME = "report"
HELP = "render a saved capture (.tmem) as text, JSON or the HTML report"


def add_parser(commands, prog: str) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        NAME, help=HELP,
        description="Renders captures written by torchmem run (or torchmem.write_capture): text on stdout by "
        "default. Several captures (the ranks of a job) make one report with a row per rank.",
    )
    parser.add_argument("captures", nargs="+", metavar="CAPTURE", help="a .tmem file (several: the ranks of a job)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--html", metavar="PATH", help="write the HTML report to PATH instead of printing text")
    output.add_argument("--json", action="store_true", help="print the report's figures as JSON instead of text")
    parser.add_argument("--top", metavar="N", type=argparse_int(minimum=1), default=10,
                        help="allocation sites listed per device (default 10)")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite the --html file if it exists")
    return parser


def execute(args: argparse.Namespace, prog: str) -> int:
    from torchmem._support import progress

    html_path = check_writable("--html", args.html, force=args.force) if args.html else None
    try:
        capture = captures.load(args.captures)
    except captures.Unreadable as error:
        print(f"{prog} {NAME}: {error}", file=sys.stderr)
        return captures.EXIT_UNREADABLE
    if html_path is not None:
        from torchmem.reports import html

        with progress.step(f"writing the HTML report {args.html}"):
            html.write_html(html_path, capture)
        print(f"HTML report written to {html_path}")
        return 0
    with progress.step("replaying the trace"):
        if args.json:
            from torchmem.reports import text

            import json

            output = json.dumps(text.report_dict(capture, top=args.top), indent=2)
        else:
            output = capture.render(top=args.top)
    print(output)
    return 0
