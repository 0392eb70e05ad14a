"""``torchmem run``: run a program under torchmem and report at exit.

    torchmem run train.py --lr 3e-4        # a script, with its own arguments
    torchmem run -m my_pkg.train --lr 3e-4 # a module, like python -m
    torchmem run --snapshot mem.pickle --json report.json train.py
    torchmem run --rss train.py            # plus host RAM per process (RSS)
    torchrun --nproc-per-node=8 -m torchmem run train.py   # one report for the whole job

``run`` installs torchmem before the program starts (the CPU always, CUDA too when a
device is available: PyTorch lets an allocator be swapped only before CUDA's first use),
runs it as ``__main__`` with its arguments (:mod:`torchmem.integrations.runner.target`),
and when it ends prints to stderr (:mod:`torchmem.integrations.runner.session`):

* the summary (``torchmem.summary()``): peak and current memory, tags, fragmentation;
* the leak report: blocks the program allocated that are still alive once its own
  global variables are released (as Python would release them at exit), each with the
  line that allocated it and what holds it, or "cycle" when only the garbage collector
  could free it (a reference cycle held it, the Composer bug);
* growth per training step: a ``torchmem.GrowthMonitor`` sampled at the end of every
  step (every ``optimizer.step()``, or every return of the ``--step-on`` functions;
  :mod:`torchmem.integrations.runner.steps`), naming the tags and allocation sites that
  grew; the leak check at exit cannot see memory the script's globals kept, this can;
* with ``--rss``, host memory per process (``torchmem.rss_report()``: this process and
  any children still running, RSS split into private, shared-anonymous, file-backed and
  shared memory) and how this process's RSS changed since the script started.

The program's exit code is kept: ``sys.exit(n)`` gives ``n``; an uncaught exception
prints its traceback and gives 1, as with ``python script.py``.

Under a launcher (``torchrun ... -m torchmem run train.py``, or any launcher that sets
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), every rank runs the script under torchmem
and rank 0 prints one report for the job instead: a row per rank, the imbalance between
ranks, every rank's leaks (``torchmem.distributed.launcher`` says how, and what happens
when a rank crashes or the ranks disagree). ``--snapshot``/``--json`` then write one file
per rank, and rank 0 the combined JSON; ``--html PATH`` is one page for the job, written by
rank 0 from every rank's capture (a row and a section per rank).
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys

from torchmem._support.validate import argparse_int, argparse_seconds
from torchmem.integrations.cli.common import EXIT_USAGE, UsageError, check_writable
from torchmem.integrations.devices import DEVICE_CHOICES

NAME = "run"
HELP = "run a script (or -m module) under torchmem and report at exit"


def add_parser(commands, prog: str) -> argparse.ArgumentParser:
    run = commands.add_parser(
        NAME,
        help=HELP,
        description=(
            "Installs torchmem, runs the script as __main__ with its arguments, and at exit prints "
            "the summary (peak, per tag, fragmentation) and the blocks the script left alive to stderr. "
            "The script's exit code is preserved."
        ),
        usage=f"{prog} run [options] (script.py | -m module) [args ...]",
    )
    run.add_argument(
        "--device",
        choices=DEVICE_CHOICES,
        default="auto",
        help="what torchmem serves and reports: auto = the CPU, plus CUDA when a device is available (default)",
    )
    run.add_argument("--snapshot", metavar="PATH", help="write a memory snapshot (PyTorch's format) at exit")
    run.add_argument(
        "--history-entries",
        metavar="N",
        type=argparse_int(minimum=0),
        default=None,
        help="events the snapshot's timeline keeps per device (default 100000; 0 for state only)",
    )
    run.add_argument("--json", metavar="PATH", help="write the summary and leak findings as JSON at exit")
    # The capture, the HTML report and the out-of-memory report: torchmem/reports/run_files.py, oom_report.py.
    run.add_argument(
        "--capture", metavar="PATH",
        help="where to write the capture at exit (default torchmem-<script>.<pid>.tmem; render it later with "
        "torchmem report)",
    )
    run.add_argument("--no-capture", action="store_true", help="write no capture file (and record no trace for it)")
    run.add_argument("--html", metavar="PATH", help="write the HTML report at exit (one file, opens without a network; "
                     "under a launcher rank 0 writes one page for the job, a section per rank)")
    run.add_argument(
        "--oom-report", metavar="DIR",
        help="at the first out-of-memory error write the capture and the HTML report into DIR; the error the "
        "script sees is unchanged (also: TORCHMEM_OOM_REPORT=DIR)",
    )
    run.add_argument(
        "--rss",
        action="store_true",
        help="also report host RAM (RSS) per process at exit, split into private / shared / file-backed "
        "(is RSS growth a leak, memory-mapped files, or copy-on-write in workers?)",
    )
    run.add_argument(
        "--no-leak-report",
        action="store_true",
        help="only the summary: no leak check (and no stack capture) while the script runs",
    )
    run.add_argument(
        "--step-on",
        metavar="MODULE:FUNCTION",
        action="append",
        default=[],
        help="the function whose return ends a training step (module:function or module:Class.method; "
        "__main__:name for the script's own); repeatable. Default: every torch.optim optimizer.step()",
    )
    run.add_argument(
        "--fail-on-leak",
        action="store_true",
        default=None,
        help="exit with status 1 when the script leaked or grew per step (and exited 0), for CI; the report is "
        "printed as usual "
        "(also: TORCHMEM_FAIL_ON_LEAK=1)",
    )
    run.add_argument(
        "-f", "--force", action="store_true",
        help="overwrite the --json / --snapshot / --capture / --html files if they exist"
    )
    run.add_argument(
        "-q", "--quiet", action="store_true",
        help="print nothing at exit unless there is something to act on: leaks, files written, problems",
    )
    run.add_argument(
        "--dist-timeout",
        metavar="SECONDS",
        type=argparse_seconds(),
        default=None,
        help="under a launcher (torchrun, or RANK/WORLD_SIZE set): seconds the ranks wait for each other "
        "before the script and for the job report at exit (default 300)",
    )
    run.add_argument(
        "--no-job-report",
        action="store_true",
        help="under a launcher: every rank prints its own report, instead of rank 0 one report for the job",
    )
    # REMAINDER: everything after "-m module" is the module's own arguments, options included.
    run.add_argument(
        "-m", dest="module", nargs=argparse.REMAINDER, metavar="module", help="run a module as a script, like python -m"
    )
    run.add_argument("target", nargs=argparse.REMAINDER, help="script.py [args ...] (or the module's args)")
    return run


def _target(args: argparse.Namespace):
    from torchmem.integrations.runner.target import Target

    rest = list(args.target)
    if args.module is not None:
        if not args.module:
            raise UsageError("-m needs a module name (torchmem run -m package.module [args])")
        return Target(None, args.module[0], args.module[1:])
    if rest and rest[0] == "--":
        rest = rest[1:]
    if not rest:
        raise UsageError("name a script to run (torchmem run script.py [args]) or -m module")
    return Target(rest[0], None, rest[1:])


def _job_run(args: argparse.Namespace):
    """The launch this process is a rank of (``torchmem.distributed.launcher``), or None."""
    from torchmem.distributed import launcher

    try:
        env = launcher.detect()
    except launcher.LaunchError as error:
        raise UsageError(str(error)) from None
    if env is None:
        return None
    args.rank_label = f" (rank {env.rank} of {env.world_size})"
    if args.no_job_report:
        args.alone_rank = env.rank  # every rank reports alone: to files of its own
        return None
    return launcher.RunJob(env, launcher.DEFAULT_TIMEOUT_S if args.dist_timeout is None else args.dist_timeout)


def _alone_rank(args: argparse.Namespace) -> int | None:
    """This process's rank when a launcher started it with --no-job-report, else None."""
    return getattr(args, "alone_rank", None)


def _own_file(args: argparse.Namespace, path: str | None) -> str | None:
    """``path`` for this rank alone (``mem.rank1.pickle``), so ranks reporting alone do not
    write one another's files."""
    from torchmem.distributed.launcher import rank_path

    return None if path is None else rank_path(path, args.alone_rank)


def _job_options(args: argparse.Namespace) -> dict:
    """The options every rank must share for their reports to combine (compared at start)."""
    return {
        "--device": args.device,
        "--no-leak-report": bool(args.no_leak_report),
        "--rss": bool(args.rss),
        "--snapshot": args.snapshot is not None,
        "--json": args.json is not None,
        "--html": args.html is not None,
        "--history-entries": args.history_entries,
    }


def _run_files(args: argparse.Namespace, target, job):
    """The capture (default ``torchmem-<script>.<pid>.tmem``) and HTML report to write at exit."""
    from torchmem.reports.run_files import RunFiles, default_name

    if args.no_capture and args.capture:
        raise UsageError("--capture PATH and --no-capture contradict each other: drop one")
    capture_arg = None if args.no_capture else (args.capture or default_name(target.script, target.module))
    html_arg = args.html
    if job is not None and args.capture:
        capture_arg = job.per_rank(capture_arg)  # the default name has the pid: one per rank already
    if _alone_rank(args) is not None:
        capture_arg = _own_file(args, capture_arg) if args.capture else capture_arg
        html_arg = _own_file(args, html_arg)
    for_job = job is not None and html_arg is not None
    if for_job:
        # One page for the job, written by rank 0 from every rank's capture.
        html_arg = html_arg if job.env.rank == 0 else None
    capture_path = check_writable("--capture", capture_arg, force=args.force) if capture_arg else None
    html_path = check_writable("--html", html_arg, force=args.force) if html_arg else None
    if for_job:
        job.combined_html_path = html_path
    return RunFiles(capture_path, html_path, label=target.label, announce_capture=bool(args.capture) or not args.quiet,
                    for_job=for_job)


def _install(device: str) -> list[str]:
    from torchmem.integrations import devices

    try:
        return devices.install(device)
    except devices.NoCudaError as error:
        raise UsageError(str(error)) from None


def _training_growth(step_on: list[str], module: str | None):
    from torchmem.integrations.runner.growth import TrainingGrowth

    return TrainingGrowth(step_on, script_module=module)


def _checked_options(args: argparse.Namespace, target, job):
    """Refuses, before anything is installed or run, what cannot work; returns the snapshot
    and JSON paths this process writes (one per rank under a launcher) and its ``RunFiles``
    (capture and HTML report)."""
    from torchmem.integrations.runner import exit_status
    from torchmem.integrations.runner.steps import parse_step_on

    snapshot_arg, json_arg = args.snapshot, args.json
    if _alone_rank(args) is not None:
        snapshot_arg, json_arg = _own_file(args, args.snapshot), _own_file(args, args.json)
    if job is not None:
        # One file per rank, the rank in its name; rank 0 also writes the combined JSON.
        snapshot_arg, json_arg = job.per_rank(args.snapshot), job.per_rank(args.json)
        if job.env.rank == 0 and args.json:
            job.combined_json_path = check_writable("--json", args.json, force=args.force)
    snapshot_path = check_writable("--snapshot", snapshot_arg, force=args.force) if snapshot_arg else None
    json_path = check_writable("--json", json_arg, force=args.force) if json_arg else None
    if args.fail_on_leak is None:
        try:
            args.fail_on_leak = exit_status.from_environment()
        except ValueError as error:
            raise UsageError(str(error)) from None
    if args.fail_on_leak and args.no_leak_report:
        raise UsageError("--fail-on-leak needs the leak report: drop --no-leak-report")
    for spec in args.step_on:
        try:
            parse_step_on(spec)
        except ValueError as error:
            raise UsageError(str(error)) from None
    if args.step_on and args.no_leak_report:
        raise UsageError("--step-on needs the leak report (the growth check is part of it): drop --no-leak-report")
    files = _run_files(args, target, job)
    if args.history_entries is not None and snapshot_path is None:
        raise UsageError("--history-entries only matters with --snapshot PATH")
    if target.script is not None and not os.path.isfile(target.script):
        reason = "is a directory" if os.path.isdir(target.script) else "No such file"
        raise UsageError(f"can't open file {target.script!r}: {reason}")
    return snapshot_path, json_path, files


def execute(args: argparse.Namespace, prog: str) -> int:
    from torchmem.integrations.runner import exit_status
    from torchmem.integrations.runner import target as _target_module
    from torchmem.integrations.runner.session import Session

    # First, before torch is imported: its exit function must run after all others.
    exit_status.arm()
    target = _target(args)
    job = _job_run(args)
    snapshot_path, json_path, files = _checked_options(args, target, job)

    served = _install(args.device)
    if args.oom_report is not None:
        from torchmem.reports import oom_report

        try:
            oom_report.oom_report(args.oom_report)
        except OSError as error:
            raise UsageError(f"--oom-report {args.oom_report}: {error}") from None
    if job is not None:
        from torchmem.distributed.launcher import LaunchError

        try:
            job.start(_job_options(args))
        except LaunchError as error:
            print(f"{prog} run (rank {job.env.rank} of {job.env.world_size}): {error}", file=sys.stderr)
            return EXIT_USAGE
    from torchmem.reports import snapshot as _snapshot

    # Resolved after installing: finding a module imports its parent packages, which may
    # touch CUDA, and CUDA must already be torchmem's by then.
    growth = None if args.no_leak_report else _training_growth(args.step_on, target.module)
    decorate = None
    if growth is not None and growth.watcher.script_decorations():
        def decorate(tree):
            return growth.watcher.decorate_script(tree, _target_module.STEP_DECORATOR)
    try:
        code, attributes = _target_module.code_for(target, decorate)
    except ImportError as error:
        print(f"{sys.executable}: {error}", file=sys.stderr)  # Python's wording for -m
        return 1
    except SyntaxError:
        _target_module.print_exception(*sys.exc_info())
        return 1
    except OSError as error:
        raise UsageError(f"can't open file {target.script!r}: {error.strerror}") from None

    if decorate is not None:
        attributes[_target_module.STEP_DECORATOR] = growth.watcher.wrapper
    if snapshot_path is not None:
        entries = _snapshot.DEFAULT_MAX_ENTRIES if args.history_entries is None else args.history_entries
        _snapshot.record_trace(entries)
    elif files.wanted and _snapshot.trace_max_entries() == 0:
        _snapshot.record_trace()  # the timeline and the sites by peak bytes of the capture
    session = Session(
        target, served, snapshot_path, json_path, leak_report=not args.no_leak_report, rss=args.rss, job=job,
        fail_on_leak=args.fail_on_leak, quiet=args.quiet, growth=growth, files=files,
    )
    session.rank_label = getattr(args, "rank_label", "")
    # Registered before the script runs, so called after every atexit function it registers.
    atexit.register(session.finish)
    session.start()
    session.exit_code = _target_module.execute(target, code, attributes, on_module=session.watch)
    return session.exit_code
