"""The ``torchmem`` command (also ``python -m torchmem``): one module per subcommand.

    torchmem run train.py --lr 3e-4        # a script under torchmem, reported at exit (cli/run.py)
    torchmem report CAPTURE [--html PATH]  # a saved capture as text, JSON or HTML (cli/report.py)
    torchmem stats CAPTURE                 # its allocation statistics (cli/stats.py)
    torchmem diff OLD NEW                  # what changed, by site or tag (cli/diff.py)
    torchmem demo                          # the Composer metrics leak, found (cli/demo.py)
    torchmem --version

A subcommand is a module of this package with ``NAME``, ``HELP``, ``add_parser(subparsers)``
(which adds and returns its argparse parser) and ``execute(args, prog) -> exit code``;
adding one is a new module and its name in ``SUBCOMMANDS``. A subcommand raises
``common.UsageError`` for a bad command line: printed as one line, exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from torchmem.integrations.cli.common import EXIT_USAGE, PROG, UsageError

__all__ = ["main"]

# Modules of this package, in the order ``--help`` lists them.
SUBCOMMANDS = ("run", "report", "stats", "diff", "demo")


def _subcommand(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchmem")
    except PackageNotFoundError:  # running from a source tree that was never installed
        import torchmem

        return torchmem.__version__


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="torchmem: who holds PyTorch memory, how fragmented the cache is, what leaked."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    commands.required = True
    for name in SUBCOMMANDS:
        _subcommand(name).add_parser(commands, prog)
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Entry point of ``torchmem`` and ``python -m torchmem``; returns the exit code."""
    try:
        args = build_parser(prog).parse_args(argv)
    except SystemExit as exit_:  # --help, --version, or a usage error argparse printed
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        return _subcommand(args.command).execute(args, prog)
    except UsageError as error:
        print(f"{prog} {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE


def console_main() -> None:
    """The ``torchmem`` console script."""
    sys.exit(main())
