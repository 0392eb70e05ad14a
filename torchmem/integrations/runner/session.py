"""What ``torchmem run`` reports when the program ends, and the leak check around it.

When the report runs. Python finishes a program in this order: wait for its threads, run
its ``atexit`` functions, release its modules' globals. ``run`` reports at exactly that
point (:meth:`Session.finish` is an ``atexit`` function registered before the program
started, hence called after all of the program's own), so the program's ``atexit`` code
still sees its globals and its threads have finished.
"""

from __future__ import annotations

import json
import os
import sys
import types

from torchmem.integrations.runner import target as _target
from torchmem.integrations.runner.target import Target


class Session:
    """Everything ``run`` reports at exit, and the leak check around the script."""

    def __init__(
        self, target: Target, served: list[str], snapshot_path, json_path, *, leak_report: bool, rss: bool = False,
        job=None, fail_on_leak: bool = False, quiet: bool = False, growth=None, files=None,
    ):
        self.growth = growth  # runner.growth.TrainingGrowth: memory per training step, or None
        self.files = files  # torchmem.reports.run_files.RunFiles: the capture and HTML report, if any
        self.fail_on_leak = fail_on_leak  # exit status 1 when the script leaked (and exited 0)
        self.quiet = quiet  # print only what needs action: the leaks, files written, problems
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
        if self.growth is not None:
            self.growth.start()

    @property
    def main_file(self) -> str | None:
        """The file of the script's code (its ``<module>`` frame), for the import-time check."""
        return None if self.module is None else self.module.__dict__.get("__file__")

    def watch(self, module: types.ModuleType) -> None:
        """Called with the script's ``__main__`` module before it runs: its globals are
        released before the leak report."""
        self.module = module

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
        if self.growth is not None:
            self.growth.stop()  # the steps are over; judged before the globals go
        if self.files is not None:
            try:
                self.files.collect()  # the state at the end of the script, before its globals go
            except Exception as error:  # noqa: BLE001 - reported, and the rest still runs
                problems.append(f"no capture: {error}")
                self.files = None
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
            if self._report is not None:
                from torchmem.integrations import import_time

                self._report = import_time.classify(self._report, self.main_file)

        label = self.target.label
        leaked = self._report is not None and self._report.exceeds_limit
        grew = self.growth is not None and self.growth.has_growth
        header = ["", "=" * 78, f"torchmem: {label}{self.rank_label} exited with code {self.exit_code}", ""]
        lines = []
        if not self.quiet:
            lines.append(_summary.render(summary))
        if self._report is not None and (leaked or not self.quiet):
            lines += ["", _leak_header(held_by_globals), self._report.render()]
        if self.growth is not None and (grew or not self.quiet):
            lines += ["", self.growth.render()]
        if self._rss is not None and not self.quiet:
            at_exit, since_start = self._rss
            lines += ["", at_exit.render(), since_start.render(title="host memory of this process since the script started:")]
        if self.snapshot_path is not None:
            lines += [
                "",
                f"snapshot written to {self.snapshot_path}",
                f"  view it: python -m torch.cuda._memory_viz trace_plot {self.snapshot_path} -o memory.html"
                "  (or drop it on https://pytorch.org/memory_viz)",
            ]
        if self.files is not None:
            written, failed = self.files.write(self._report)
            lines += [""] + written if written else []
            problems += failed
        if self.json_path is not None:
            try:
                with open(self.json_path, "w") as file:
                    json.dump(self._json(summary, held_by_globals), file, indent=2)
                lines += ["", f"JSON report written to {self.json_path}"]
            except OSError as error:
                problems.append(f"could not write the JSON report: {error}")
        lines += [f"torchmem: {problem}" for problem in problems]
        verdict = None  # the line that says why the exit status is 1
        if (leaked or grew) and self.fail_on_leak and self.exit_code == 0:
            from torchmem.integrations.runner import exit_status

            exit_status.fail_with(1)
            why = [f"leaked {_leaked_text(self._report)}"] if leaked else []
            why += ["grew over its training steps"] if grew else []
            verdict = f"torchmem{self.rank_label}: exit code 1: the script {' and '.join(why)} (--fail-on-leak)"
            lines += ["", verdict]
        # Quiet and nothing to act on: nothing at all, as the script alone would print.
        lines = header + lines if lines or not self.quiet else []
        local_text = "\n".join(lines)
        if self.job is not None:
            files = {"snapshot": self.snapshot_path, "json": self.json_path}
            capture = self.files.job_capture() if self.files is not None else None
            self.job.finish(summary=summary, leak_report=self._report, exit_code=self.exit_code, files=files,
                            label=label, local_text=local_text, capture=capture,
                            growth_report=None if self.growth is None else self.growth.report)
            if verdict is not None:  # rank 0 printed the job's report; each failing rank says why it fails
                print(verdict, file=out)
                out.flush()
            return
        if local_text:
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
            "growth": self.growth.to_dict() if self.growth is not None else None,
            "snapshot": self.snapshot_path,
            "rss": None
            if self._rss is None
            else {"at_exit": self._rss[0].to_dict(), "since_start": self._rss[1].to_dict()},
        }


def _trim_runner_frames(data: dict) -> None:
    """Drops the frames of ``python -m torchmem run`` itself (runpy, torchmem's __main__ and
    this module) from the outer end of every stack in a snapshot, so the script's
    ``<module>`` frame is outermost, as under ``python script.py``."""
    runner = _target.runner_frame()
    done: set[int] = set()

    def trim(frames: list) -> None:
        if id(frames) in done:  # stacks are shared between blocks and events
            return
        done.add(id(frames))
        for index, frame in enumerate(frames):
            if (frame["name"], os.path.normcase(os.path.abspath(frame["filename"]))) == runner:
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


def _leaked_text(report) -> str:
    from torchmem._support.units import format_bytes

    blocks = len(report.leaked)
    return f"{format_bytes(report.leaked_bytes)} in {blocks} block{'s' if blocks != 1 else ''}"


def _leak_header(held_by_globals: int) -> str:
    from torchmem._support.units import format_bytes

    return (
        "leaks at exit: blocks the script allocated that are still alive after its globals were\n"
        f"released, as Python releases them at exit ({format_bytes(held_by_globals)} was freed then)"
    )
