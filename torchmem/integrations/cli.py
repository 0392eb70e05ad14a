"""``python -m torchmem``: run a program under torchmem, or see what it finds.

    python -m torchmem run train.py --lr 3e-4        # a script, with its own arguments
    python -m torchmem run -m my_pkg.train --lr 3e-4 # a module, like python -m
    python -m torchmem run --snapshot mem.pickle --json report.json train.py
    python -m torchmem run --rss train.py            # plus host RAM per process (RSS)
    python -m torchmem demo                          # the Composer metrics leak, found
    torchrun --nproc-per-node=8 -m torchmem run train.py   # one report for the whole job

``run`` installs torchmem before the program starts (the CPU always, CUDA too when a
device is available: PyTorch lets an allocator be swapped only before CUDA's first use),
runs it as ``__main__`` with its arguments, and when it ends prints to stderr:

* the summary (``torchmem.summary()``): peak and current memory, tags, fragmentation;
* the leak report: blocks the program allocated that are still alive once its own
  global variables are released (as Python would release them at exit), each with the
  line that allocated it and what holds it, or "cycle" when only the garbage collector
  could free it (a reference cycle held it, the Composer bug);
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
per rank, and rank 0 the combined JSON.

When the report runs. Python finishes a program in this order: wait for its threads,
run its ``atexit`` functions, release its modules' globals. ``run`` reports at exactly
that point (from an ``atexit`` function registered before the program started, hence
called after all of the program's own), so the program's ``atexit`` code still sees its
globals and its threads have finished. Growth across loop iterations needs to know where
an iteration ends; use ``torchmem.GrowthMonitor`` in the loop for that.
"""

from __future__ import annotations

import argparse
import atexit
import builtins
import io
import json
import os
import sys
import traceback
import types

__all__ = ["main"]

PROG = "python -m torchmem"

# Exit codes of our own failures, as Python uses them: 2 for command-line errors (and
# "can't open file"), 1 for a module that cannot be found.
EXIT_USAGE = 2


class _UsageError(Exception):
    """A bad command line or option value: printed as one line, exit code 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="torchmem: who holds PyTorch memory, how fragmented the cache is, what leaked.",
    )
    commands = parser.add_subparsers(dest="command", metavar="{run,demo}")
    commands.required = True

    run = commands.add_parser(
        "run",
        help="run a script (or -m module) under torchmem and report at exit",
        description=(
            "Installs torchmem, runs the script as __main__ with its arguments, and at exit prints "
            "the summary (peak, per tag, fragmentation) and the blocks the script left alive to stderr. "
            "The script's exit code is preserved."
        ),
        usage=f"{PROG} run [options] (script.py | -m module) [args ...]",
    )
    run.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="what torchmem serves and reports: auto = the CPU, plus CUDA when a device is available (default)",
    )
    run.add_argument("--snapshot", metavar="PATH", help="write a memory snapshot (PyTorch's format) at exit")
    run.add_argument(
        "--history-entries",
        metavar="N",
        type=int,
        default=None,
        help="events the snapshot's timeline keeps per device (default 100000; 0 for state only)",
    )
    run.add_argument("--json", metavar="PATH", help="write the summary and leak findings as JSON at exit")
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
        "--dist-timeout",
        metavar="SECONDS",
        type=float,
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

    demo = commands.add_parser(
        "demo",
        help="a training loop with the Composer metrics leak, and the report that names it",
        description=(
            "Trains a tiny model whose loop deep-copies a torchmetrics Metric on every batch (the "
            "bug in mosaicml/composer#3153), shows torchmem's leak and growth reports naming it, then "
            "shows the fixed loop is clean. Takes a few seconds on CPU."
        ),
    )
    demo.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto = CPU tensors, and CUDA tensors too when a device is available (default)",
    )
    demo.add_argument("--steps", type=int, default=10, help="training steps per loop (default 10; 3 to 100)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m torchmem``; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            return _run_command(args)
        from torchmem.integrations import demo as _demo

        return _demo.main(device=args.device, steps=args.steps)
    except _UsageError as error:
        print(f"{PROG} {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE


# --- run ----------------------------------------------------------------------------------


class _Target:
    """What to run: a script path or a module name, and the argv it sees."""

    def __init__(self, script: str | None, module: str | None, args: list[str]):
        self.script = script
        self.module = module
        self.args = args

    @property
    def label(self) -> str:
        return self.script if self.script is not None else f"-m {self.module}"


def _target(args: argparse.Namespace) -> _Target:
    rest = list(args.target)
    if args.module is not None:
        if not args.module:
            raise _UsageError("-m needs a module name (python -m torchmem run -m package.module [args])")
        return _Target(None, args.module[0], args.module[1:])
    if rest and rest[0] == "--":
        rest = rest[1:]
    if not rest:
        raise _UsageError("name a script to run (python -m torchmem run script.py [args]) or -m module")
    return _Target(rest[0], None, rest[1:])


def _check_writable(option: str, path: str) -> str:
    """Fails before the script runs, not after an hour of training, if ``path`` cannot be written."""
    absolute = os.path.abspath(path)
    directory = os.path.dirname(absolute)
    if os.path.isdir(absolute):
        raise _UsageError(f"{option} {path}: is a directory; give a file name")
    if not os.path.isdir(directory):
        raise _UsageError(f"{option} {path}: the directory {directory} does not exist")
    if not os.access(directory, os.W_OK) or (os.path.exists(absolute) and not os.access(absolute, os.W_OK)):
        raise _UsageError(f"{option} {path}: not writable")
    return absolute


def _cuda_available() -> bool:
    """A CUDA device is there and torchmem can serve it, checked without initializing CUDA."""
    import torch

    from torchmem.runtime import cuda as _cuda

    if not _cuda.supported():
        return False
    # Counts devices without initializing PyTorch's CUDA state (so the allocator can still be swapped).
    return torch.cuda.is_available()


def _install(device: str) -> list[str]:
    """Installs torchmem for ``device`` (auto, cpu, cuda); returns the device types served."""
    import torchmem

    if device == "cuda" and not _cuda_available():
        raise _UsageError("--device cuda: no CUDA device is available to torchmem here (try --device cpu)")
    served = []
    if device in ("auto", "cpu"):
        torchmem.install("cpu")
        served.append("cpu")
    if device == "cuda" or (device == "auto" and _cuda_available()):
        torchmem.install("cuda")
        served.append("cuda")
    return served


def _job_run(args: argparse.Namespace):
    """The launch this process is a rank of (``torchmem.distributed.launcher``), or None."""
    from torchmem.distributed import launcher

    if args.dist_timeout is not None and not args.dist_timeout > 0:
        raise _UsageError(f"--dist-timeout must be seconds > 0, got {args.dist_timeout:g}")
    try:
        env = launcher.detect()
    except launcher.LaunchError as error:
        raise _UsageError(str(error)) from None
    if env is None:
        return None
    args.rank_label = f" (rank {env.rank} of {env.world_size})"
    if args.no_job_report:
        return None
    return launcher.RunJob(env, launcher.DEFAULT_TIMEOUT_S if args.dist_timeout is None else args.dist_timeout)


def _job_options(args: argparse.Namespace) -> dict:
    """The options every rank must share for their reports to combine (compared at start)."""
    return {
        "--device": args.device,
        "--no-leak-report": bool(args.no_leak_report),
        "--rss": bool(args.rss),
        "--snapshot": args.snapshot is not None,
        "--json": args.json is not None,
        "--history-entries": args.history_entries,
    }


def _run_command(args: argparse.Namespace) -> int:
    target = _target(args)
    job = _job_run(args)
    snapshot_arg, json_arg = args.snapshot, args.json
    if job is not None:
        # One file per rank, the rank in its name; rank 0 also writes the combined JSON.
        snapshot_arg, json_arg = job.per_rank(args.snapshot), job.per_rank(args.json)
        if job.env.rank == 0 and args.json:
            job.combined_json_path = _check_writable("--json", args.json)
    snapshot_path = _check_writable("--snapshot", snapshot_arg) if snapshot_arg else None
    json_path = _check_writable("--json", json_arg) if json_arg else None
    if args.history_entries is not None:
        if args.history_entries < 0:
            raise _UsageError(f"--history-entries must be >= 0, got {args.history_entries}")
        if snapshot_path is None:
            raise _UsageError("--history-entries only matters with --snapshot PATH")
    if target.script is not None and not os.path.isfile(target.script):
        reason = "is a directory" if os.path.isdir(target.script) else "No such file"
        raise _UsageError(f"can't open file {target.script!r}: {reason}")

    served = _install(args.device)
    if job is not None:
        from torchmem.distributed.launcher import LaunchError

        try:
            job.start(_job_options(args))
        except LaunchError as error:
            print(f"{PROG} run (rank {job.env.rank} of {job.env.world_size}): {error}", file=sys.stderr)
            return EXIT_USAGE
    from torchmem.reports import snapshot as _snapshot

    # Resolved after installing: finding a module imports its parent packages, which may
    # touch CUDA, and CUDA must already be torchmem's by then.
    try:
        code, attributes = _code_for(target)
    except ImportError as error:
        print(f"{sys.executable}: {error}", file=sys.stderr)  # Python's wording for -m
        return 1
    except SyntaxError:
        _print_exception(*sys.exc_info())
        return 1
    except OSError as error:
        raise _UsageError(f"can't open file {target.script!r}: {error.strerror}") from None

    if snapshot_path is not None:
        entries = _snapshot.DEFAULT_MAX_ENTRIES if args.history_entries is None else args.history_entries
        _snapshot.record_trace(entries)
    session = _Session(
        target, served, snapshot_path, json_path, leak_report=not args.no_leak_report, rss=args.rss, job=job
    )
    session.rank_label = getattr(args, "rank_label", "")
    # Registered before the script runs, so called after every atexit function it registers.
    atexit.register(session.finish)
    session.start()
    session.exit_code = _execute(target, code, attributes, session)
    return session.exit_code


def _code_for(target: _Target) -> tuple[types.CodeType, dict]:
    """The code object to run and the module attributes ``__main__`` gets, like Python's."""
    if target.script is not None:
        path = os.path.abspath(target.script)
        with io.open_code(path) as file:
            source = file.read()
        # Absolute, as Python 3.9+ makes a script's __file__ and code file names.
        code = compile(source, path, "exec", dont_inherit=True)
        return code, {"__file__": path, "__cached__": None, "__spec__": None, "__package__": None}
    import runpy

    # runpy's resolver, as pdb uses it: finds packages' __main__ and raises ImportError
    # with Python's own message ("No module named ...").
    name, spec, code = runpy._get_module_details(target.module)  # noqa: SLF001
    return code, {
        "__file__": spec.origin,
        "__cached__": spec.cached,
        "__spec__": spec,
        "__package__": spec.parent,
        "__loader__": spec.loader,
    }


def _execute(target: _Target, code: types.CodeType, attributes: dict, session: "_Session") -> int:
    """Runs ``code`` as ``__main__`` with the target's argv; returns the exit code Python would."""
    module = types.ModuleType("__main__")
    module.__dict__.update(attributes)
    module.__dict__["__builtins__"] = builtins
    if target.script is not None:
        # A script's directory is first on sys.path (python script.py); with -m it stays cwd.
        sys.path[0] = os.path.dirname(os.path.abspath(target.script))
        sys.argv[:] = [target.script, *target.args]
    else:
        sys.argv[:] = [attributes["__file__"] or target.module, *target.args]
    # The script is __main__ while it runs (pickle, multiprocessing and `if __name__ ==
    # "__main__"` depend on it) and stays so until torchmem has reported.
    sys.modules["__main__"] = module
    session.module = module
    try:
        exec(code, module.__dict__)
    except SystemExit as exit_:
        return _exit_code(exit_)
    except KeyboardInterrupt:
        _print_exception(*sys.exc_info())
        return 130  # 128 + SIGINT, what a shell reports for Ctrl-C
    except BaseException:
        _print_exception(*sys.exc_info())
        return 1
    return 0


def _exit_code(exit_: SystemExit) -> int:
    """What Python exits with for ``SystemExit(code)``."""
    code = exit_.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _print_exception(exc_type, exc, tb) -> None:
    """Prints a traceback as Python would for the script: without torchmem's own frames."""
    here = os.path.normcase(os.path.abspath(__file__))
    while tb is not None and os.path.normcase(os.path.abspath(tb.tb_frame.f_code.co_filename)) == here:
        tb = tb.tb_next
    try:
        sys.excepthook(exc_type, exc.with_traceback(tb), tb)
    finally:
        # The frames of the traceback hold the script's locals (tensors among them); free
        # them now rather than leave them to the garbage collector and the leak report.
        if tb is not None:
            traceback.clear_frames(tb)
        exc.__traceback__ = None


class _Session:
    """Everything ``run`` reports at exit, and the leak check around the script."""

    def __init__(
        self, target: _Target, served: list[str], snapshot_path, json_path, *, leak_report: bool, rss: bool = False,
        job=None,
    ):
        self.job = job  # torchmem.distributed.launcher.RunJob when a launcher started many ranks
        self.rank_label = ""  # " (rank r of n)" when a launcher started this process
        self.target = target
        self.served = served
        self.snapshot_path = snapshot_path
        self.json_path = json_path
        self.leak_report = leak_report
        self.module: types.ModuleType | None = None
        self.exit_code: int | None = None
        self._check = None
        self._report = None
        self.rss = rss
        self._rss_start = None  # this process's RSS before the script (children have none yet)
        self._rss = None  # (report at exit, change since the start)

    def start(self) -> None:
        if self.rss:
            from torchmem.host import rss as _rss

            self._rss_start = _rss.rss_report(children=False)
        if self.leak_report:
            import torchmem

            self._check = torchmem.leak_check(raise_on_leak=False, gc_collect=True)
            self._report = self._check.__enter__()

    def finish(self) -> None:
        """Reports; runs as an atexit function, after the script's own."""
        from torchmem.reports import snapshot as _snapshot
        from torchmem.reports import summary as _summary

        if self.job is not None:
            self.job.entering_report()
        try:
            sys.stdout.flush()  # the script's output first
        except (OSError, ValueError):  # closed or broken by the script: nothing to keep in order
            pass
        out = sys.stderr
        problems = []
        if self.snapshot_path is not None:
            # The state at the end of the script, before its globals are released.
            try:
                data = _snapshot.snapshot()
                _trim_runner_frames(data)
                _snapshot.write_pickle(data, self.snapshot_path)
            except Exception as error:  # noqa: BLE001 - reported, and the rest still runs
                problems.append(f"could not write the snapshot: {error}")
                self.snapshot_path = None
        if self.rss:
            # Like the snapshot: the state at the end of the script, before its globals go.
            try:
                self._rss = self._rss_at_exit()
            except Exception as error:  # noqa: BLE001 - reported, and the rest still runs
                problems.append(f"no RSS report: {error}")
        summary = _summary.summary_dict()
        held_by_globals = 0
        if self._check is not None:
            before = _allocated(summary)
            self._release_globals()
            after = _allocated(_summary.summary_dict())
            held_by_globals = max(0, before - after)
            try:
                self._check.__exit__(None, None, None)
            except RuntimeError as error:  # e.g. the script left a leak_check of its own open
                problems.append(f"no leak report: {error}")
                self._report = None

        label = self.target.label
        lines = ["", "=" * 78, f"torchmem: {label}{self.rank_label} exited with code {self.exit_code}", ""]
        lines.append(_summary.render(summary))
        if self._report is not None:
            lines += ["", _leak_header(held_by_globals), self._report.render()]
        if self._rss is not None:
            at_exit, since_start = self._rss
            lines += ["", at_exit.render(), since_start.render(title="host memory of this process since the script started:")]
        if self.snapshot_path is not None:
            lines += [
                "",
                f"snapshot written to {self.snapshot_path}",
                f"  view it: python -m torch.cuda._memory_viz trace_plot {self.snapshot_path} -o memory.html"
                "  (or drop it on https://pytorch.org/memory_viz)",
            ]
        if self.json_path is not None:
            try:
                with open(self.json_path, "w") as file:
                    json.dump(self._json(summary, held_by_globals), file, indent=2)
                lines += ["", f"JSON report written to {self.json_path}"]
            except OSError as error:
                problems.append(f"could not write the JSON report: {error}")
        lines += [f"torchmem: {problem}" for problem in problems]
        local_text = "\n".join(lines)
        if self.job is not None:
            files = {"snapshot": self.snapshot_path, "json": self.json_path}
            self.job.finish(summary=summary, leak_report=self._report, exit_code=self.exit_code, files=files,
                            label=label, local_text=local_text)
            return
        print(local_text, file=out)
        out.flush()

    def _rss_at_exit(self):
        """(report of this process and its children, change of this process since the start)."""
        from torchmem.host import rss as _rss

        at_exit = _rss.rss_report(children=True)
        main_only = _rss.RssReport(at_exit.time, at_exit.processes[:1], at_exit.torchmem_cpu)
        return at_exit, _rss.rss_delta(self._rss_start, main_only)

    def _release_globals(self) -> None:
        """Releases the script's globals the way Python does at exit (names starting with
        ``_`` first, then the rest, each set to None), so that what survives is held by
        something else: another module, a cache, or a reference cycle."""
        module = self.module
        if module is None:
            return
        namespace = module.__dict__
        # CPython's order (_PyModule_ClearDict): "_private" names first, then the others.
        # Dunder names (__file__, __spec__, ...) are module metadata and hold no tensors: kept.
        private = [name for name in namespace if name.startswith("_") and not name.startswith("__")]
        public = [name for name in namespace if not name.startswith("_")]
        for name in private + public:
            namespace[name] = None

    def _json(self, summary: dict, held_by_globals: int) -> dict:
        return {
            "target": {"script": self.target.script, "module": self.target.module, "args": self.target.args},
            "rank": None if self.job is None else self.job.env.rank,
            "world_size": None if self.job is None else self.job.env.world_size,
            "exit_code": self.exit_code,
            "devices": self.served,
            "summary": summary,
            "released_with_globals_bytes": held_by_globals if self._report is not None else None,
            "leaks": self._report.to_dict() if self._report is not None else None,
            "snapshot": self.snapshot_path,
            "rss": None
            if self._rss is None
            else {"at_exit": self._rss[0].to_dict(), "since_start": self._rss[1].to_dict()},
        }


def _trim_runner_frames(data: dict) -> None:
    """Drops the frames of ``python -m torchmem run`` itself (runpy, torchmem's __main__ and
    this module) from the outer end of every stack in a snapshot, so the script's
    ``<module>`` frame is outermost, as under ``python script.py``."""
    here = os.path.normcase(os.path.abspath(__file__))
    done: set[int] = set()

    def trim(frames: list) -> None:
        if id(frames) in done:  # stacks are shared between blocks and events
            return
        done.add(id(frames))
        for index, frame in enumerate(frames):
            if frame["name"] == _execute.__name__ and os.path.normcase(os.path.abspath(frame["filename"])) == here:
                del frames[index:]
                return

    for segment in data["segments"]:
        for block in segment["blocks"]:
            trim(block["frames"])
    for trace in data["device_traces"]:
        for entry in trace:
            trim(entry["frames"])


def _allocated(summary: dict) -> int:
    return sum(device["allocated"]["current"] for device in summary["devices"].values())


def _leak_header(held_by_globals: int) -> str:
    from torchmem._support.units import format_bytes

    return (
        "leaks at exit: blocks the script allocated that are still alive after its globals were\n"
        f"released, as Python releases them at exit ({format_bytes(held_by_globals)} was freed then)"
    )
