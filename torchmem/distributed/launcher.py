"""The job report of ``python -m torchmem run`` when a launcher started many ranks.

    torchrun --nproc-per-node=4 -m torchmem run train.py --lr 3e-4
    srun ... python -m torchmem run train.py          # any launcher that sets RANK, WORLD_SIZE,
                                                      #   MASTER_ADDR and MASTER_PORT

Each rank runs the script under torchmem as ``run`` always does; what changes is the end:
every rank sends its ``RankReport`` to rank 0, which prints one ``JobReport`` for the job
and writes the combined JSON. The transport is the launcher's own key-value store, the one
``init_process_group("env://")`` uses, so the report does not depend on the script's process
group (scripts destroy it before they exit):

* under torchrun (``TORCHELASTIC_USE_AGENT_STORE=True``) the elastic agent hosts a
  ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT`` for the whole job; every rank is a client;
* under any other launcher, rank 0 hosts the ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``
  before the script starts, as a multi-tenant store: the script's own
  ``init_process_group`` on rank 0 then shares that server (PyTorch's ``_create_c10d_store``
  asks for a multi-tenant store), and the other ranks are clients.

Keys live under ``torchmem/<protocol>/<run id>/<restart>/`` (torchrun's run id and restart
count), so elastic restarts never read an earlier attempt's reports.

Two exchanges, both bounded by ``--dist-timeout`` (default 300 s):

1. Before the script: every rank posts a hello (torchmem version, protocol, world size,
   ``run`` options); rank 0 compares them and posts one verdict; every rank reads it, so
   every rank either runs the script or exits with the same error (exit code 2): torchmem
   versions or options differ, a rank is not running under torchmem, two processes claim
   the same rank.
2. At exit: every rank posts its report; rank 0 waits for all of them (or the deadline, or
   a SIGTERM: torchrun stops every rank when one fails, and then rank 0 reports what it
   has within seconds) and names the ranks that sent nothing.

A rank that cannot reach the store at exit prints its own report instead, saying so.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torchmem
from torchmem.distributed import payload as _payload
from torchmem.distributed.job import JobReport, format_ranks

__all__ = ["LaunchEnvironment", "LaunchError", "detect", "JobChannel", "RunJob", "rank_path", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 300.0
_POLL_S = 0.2  # how often rank 0, waiting for reports, looks for them and for a SIGTERM
_GRACE_AFTER_SIGTERM_S = 3.0  # other ranks are being stopped too: let their reports arrive


class LaunchError(RuntimeError):
    """The launcher's environment is unusable, or the ranks cannot agree: exit code 2."""


@dataclass(frozen=True)
class LaunchEnvironment:
    """What the launcher told this process (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT...)."""

    rank: int
    world_size: int
    local_rank: int | None
    master_addr: str | None
    master_port: int | None
    agent_store: bool  # torchrun's elastic agent hosts the store
    run_id: str
    attempt: int

    @property
    def launcher(self) -> str:
        return "torchrun" if self.agent_store else "launcher"


def _int(environ, name: str) -> int | None:
    value = environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{name}={value!r} is not an integer; the launcher must set it to one") from None


def detect(environ=None) -> LaunchEnvironment | None:
    """The launch this process is part of, or None when it runs alone (no RANK/WORLD_SIZE, or
    WORLD_SIZE=1)."""
    environ = os.environ if environ is None else environ
    rank, world_size = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
    if rank is None and world_size is None:
        return None
    if rank is None or world_size is None:
        have, lack = ("RANK", "WORLD_SIZE") if rank is not None else ("WORLD_SIZE", "RANK")
        raise LaunchError(f"{have} is set but {lack} is not: set both (a launcher such as torchrun does), or neither")
    if world_size < 1 or not 0 <= rank < world_size:
        raise LaunchError(f"RANK={rank} does not fit WORLD_SIZE={world_size} (ranks are 0..WORLD_SIZE-1)")
    if world_size == 1:
        return None
    port = _int(environ, "MASTER_PORT")
    if port is not None and not 0 < port < 65536:
        raise LaunchError(f"MASTER_PORT={port} is not a TCP port")
    return LaunchEnvironment(
        rank=rank,
        world_size=world_size,
        local_rank=_int(environ, "LOCAL_RANK"),
        master_addr=environ.get("MASTER_ADDR") or None,
        master_port=port,
        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        run_id=environ.get("TORCHELASTIC_RUN_ID") or "job",
        attempt=_int(environ, "TORCHELASTIC_RESTART_COUNT") or 0,
    )


def rank_path(path: str, rank: int) -> str:
    """The file a rank writes for ``path``: ``{rank}`` in it replaced, else ``.rank<N>`` added
    before the extension (``mem.pickle`` -> ``mem.rank3.pickle``)."""
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    directory, name = os.path.split(path)
    stem, dot, extension = name.rpartition(".")
    renamed = f"{stem}.rank{rank}.{extension}" if dot and stem else f"{name}.rank{rank}"
    return os.path.join(directory, renamed)


class JobChannel:
    """The launcher's store, as ``run`` uses it: hello and verdict before the script, reports
    after it. ``open()`` connects (rank 0 hosts the server when no torchrun agent does)."""

    def __init__(self, env: LaunchEnvironment, timeout: float = DEFAULT_TIMEOUT_S):
        self.env = env
        self.timeout = timeout
        self.store = None
        self._server = None  # rank 0's multi-tenant TCPStore, kept alive until the process ends
        self.stop_requested = False  # set by SIGTERM: stop waiting, report what is there
        self._stopped = False  # a SIGTERM cut the wait for reports short

    # --- connecting -----------------------------------------------------------------------
    def open(self) -> None:
        env = self.env
        if env.master_addr is None or env.master_port is None:
            raise LaunchError(
                "MASTER_ADDR and MASTER_PORT are not set, so the ranks have no store to meet at; set them "
                "(torchrun does), or run with --no-job-report to get one report per rank"
            )
        import torch.distributed as dist

        wait = timedelta(seconds=self.timeout)
        try:
            if env.rank == 0 and not env.agent_store:
                # Multi-tenant: the script's init_process_group() on this rank reuses this server.
                store = dist.TCPStore(env.master_addr, env.master_port, None, True, wait,
                                      wait_for_workers=False, multi_tenant=True)
                self._server = store
            else:
                store = dist.TCPStore(env.master_addr, env.master_port, None, False, wait, wait_for_workers=False)
        except Exception as error:  # noqa: BLE001 - RuntimeError/DistNetworkError, with the address
            role = "host" if env.rank == 0 and not env.agent_store else "reach"
            raise LaunchError(
                f"rank {env.rank} cannot {role} the job's store at {env.master_addr}:{env.master_port} "
                f"within {self.timeout:g} s ({_one_line(error)}). Check MASTER_ADDR/MASTER_PORT, or use "
                "--no-job-report for one report per rank"
            ) from error
        prefix = f"torchmem/{_payload.PROTOCOL}/{env.run_id}/{env.attempt}/"
        self.store = dist.PrefixStore(prefix, store)

    # --- before the script ------------------------------------------------------------------
    def handshake(self, options: dict) -> None:
        """Every rank posts its hello; rank 0 decides; every rank gets the same verdict.
        Raises ``LaunchError`` (the verdict's text) when the ranks cannot run together."""
        env, store = self.env, self.store
        if store.add(f"hello_claims/{env.rank}", 1) > 1:
            raise LaunchError(
                f"another process already runs as rank {env.rank} of this job (RANK={env.rank}); every "
                "rank needs its own RANK"
            )
        hello = {
            "version": torchmem.__version__,
            "protocol": _payload.PROTOCOL,
            "world_size": env.world_size,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "options": options,
        }
        store.set(f"hello/{env.rank}", json.dumps(hello))
        if store.add("hello_count", 1) == env.world_size:
            store.set("hello_all", "1")
        if env.rank == 0:
            verdict, readers = self._decide()
            store.set("verdict", verdict)
            if verdict != "ok" and self._server is not None:
                # This process hosts the store and is about to exit: not before the others read it.
                self._wait_for_count("verdict_read", readers, min(self.timeout, 30.0))
        else:
            if not self._wait("verdict", self.timeout * 1.1):
                raise LaunchError(
                    f"rank 0 gave no verdict within {self.timeout:g} s: rank 0 is not running under "
                    f"torchmem, or could not start (its output says why). Run every rank as "
                    f"`python -m torchmem run ...` (under torchrun: torchrun ... -m torchmem run script.py)"
                )
            try:
                verdict = store.get("verdict").decode()
                store.add("verdict_read", 1)
            except Exception as error:  # noqa: BLE001 - rank 0 (hosting the store) went away
                raise LaunchError(f"lost the job's store while reading rank 0's verdict ({_one_line(error)})") from error
        if verdict != "ok":
            raise LaunchError(verdict)

    def _wait_for_count(self, key: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while count > 0 and time.monotonic() < deadline:
            try:
                if self.store.add(key, 0) >= count:
                    return
            except Exception:  # noqa: BLE001
                return
            time.sleep(0.05)

    def _decide(self) -> tuple[str, int]:
        """Rank 0's verdict on the hellos, and how many other ranks are there to read it."""
        store, world = self.store, self.env.world_size
        if not self._wait("hello_all", self.timeout):
            missing = [rank for rank in range(world) if not store.check([f"hello/{rank}"])]
            return (
                f"{format_ranks(missing)} of {world} did not start under torchmem within {self.timeout:g} s: "
                "every rank must run `python -m torchmem run ...` (under torchrun: torchrun ... -m torchmem "
                "run script.py), with the same WORLD_SIZE"
            ), world - 1 - len(missing)
        hellos = [json.loads(value) for value in store.multi_get([f"hello/{rank}" for rank in range(world)])]
        fields = {
            "torchmem version": lambda hello: hello["version"],
            "protocol": lambda hello: hello.get("protocol"),
            "WORLD_SIZE": lambda hello: hello.get("world_size"),
        }
        for option in sorted({name for hello in hellos for name in hello.get("options", {})}):
            fields[option] = lambda hello, option=option: hello.get("options", {}).get(option)
        differences = []
        for label, read in fields.items():
            values: dict = {}
            for rank, hello in enumerate(hellos):
                values.setdefault(json.dumps(read(hello)), []).append(rank)
            if len(values) > 1:
                parts = "; ".join(f"{format_ranks(ranks)}: {json.loads(value)}" for value, ranks in values.items())
                differences.append(f"  {label}: {parts}")
        if differences:
            return (
                "the ranks of this job run torchmem differently, so their reports cannot be combined:\n"
                + "\n".join(differences)
                + "\nRun every rank with the same torchmem version and the same `python -m torchmem run` options."
            ), world - 1
        return "ok", world - 1

    # --- after the script -------------------------------------------------------------------
    def send_capture(self, data: bytes) -> None:
        """Posts this rank's capture (``.tmem`` bytes) for rank 0's page of the job; before
        the report, so every capture is there once every report is."""
        self.store.set(f"capture/{self.env.rank}", data)

    def captures(self, ranks: list[int]) -> dict[int, bytes]:
        """On rank 0, after :meth:`collect`: the captures the given ranks posted."""
        present = [rank for rank in ranks if self.store.check([f"capture/{rank}"])]
        values = self.store.multi_get([f"capture/{rank}" for rank in present]) if present else []
        return dict(zip(present, values))

    def send(self, data: bytes) -> None:
        store = self.store
        store.set(f"report/{self.env.rank}", data)
        if store.add("report_count", 1) == self.env.world_size:
            store.set("report_all", "1")

    def collect(self) -> tuple[list[_payload.RankReport], dict[int, str]]:
        """On rank 0: every rank's report that arrived before the deadline (or, after SIGTERM,
        within a few seconds), and why each missing rank is missing."""
        store, world = self.store, self.env.world_size
        complete = self._wait_interruptible("report_all", self.timeout)
        keys = [f"report/{rank}" for rank in range(world)]
        present = list(range(world)) if complete else [rank for rank in range(world) if store.check([keys[rank]])]
        reports, missing = [], {}
        values = store.multi_get([keys[rank] for rank in present]) if present else []
        for rank, value in zip(present, values):
            try:
                reports.append(_payload.RankReport.from_dict(_payload.decode(value)))
            except _payload.ProtocolMismatch as error:
                missing[rank] = f"its report cannot be read ({error})"
        waited = "until rank 0 was told to stop (SIGTERM)" if self._stopped else f"{self.timeout:g} s"
        for rank in range(world):
            if rank not in present:
                missing[rank] = (
                    f"no report after waiting {waited}: the rank ended before torchmem's exit hook ran "
                    "(killed by a signal, os._exit, a native crash), or it is still running"
                )
        return reports, missing

    def _wait(self, key: str, timeout: float) -> bool:
        """Waits for ``key`` up to ``timeout`` s (one blocking request to the store)."""
        try:
            self.store.wait([key], timedelta(seconds=timeout))
            return True
        except Exception:  # noqa: BLE001 - DistStoreError on timeout; a lost store reads the same
            return bool(self._check(key))

    def _wait_interruptible(self, key: str, timeout: float) -> bool:
        """``_wait``, polling so that a SIGTERM is noticed: after one, only a short grace is left
        for the other ranks (stopped at the same moment) to send theirs. Used by rank 0 alone."""
        deadline = time.monotonic() + timeout
        while True:
            if self._check(key):
                return True
            now = time.monotonic()
            if self.stop_requested:
                deadline = min(deadline, now + _GRACE_AFTER_SIGTERM_S)
                self.stop_requested = False  # the grace is set once
                self._stopped = True
            if now >= deadline:
                return False
            time.sleep(min(_POLL_S, deadline - now))

    def _check(self, key: str) -> bool:
        try:
            return bool(self.store.check([key]))
        except Exception:  # noqa: BLE001 - the store is gone: nothing more will arrive
            return False


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


class SigtermWatch:
    """Turns SIGTERM into an orderly end while ``run`` is in charge: during the script it
    raises ``SystemExit(143)`` (so ``finally`` blocks and the exit report run; 128 + 15 is what
    a shell reports for SIGTERM), during the report it only marks the channel so rank 0 stops
    waiting. Installed only when SIGTERM has its default action (a script that sets its own
    handler keeps it)."""

    EXIT_CODE = 128 + signal.SIGTERM

    def __init__(self, channel: JobChannel | None):
        self.channel = channel
        self.received = False
        self.in_report = False
        self.installed = False

    def install(self) -> None:
        try:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, self._handle)
                self.installed = True
        except ValueError:  # not the main thread
            pass

    def _handle(self, signum, frame) -> None:
        self.received = True
        if self.channel is not None:
            self.channel.stop_requested = True
        if not self.in_report:
            raise SystemExit(self.EXIT_CODE)


class RunJob:
    """What ``python -m torchmem run`` does differently on a rank of a launched job."""

    def __init__(self, env: LaunchEnvironment, timeout: float = DEFAULT_TIMEOUT_S):
        self.env = env
        self.channel = JobChannel(env, timeout)
        self.sigterm = SigtermWatch(self.channel)
        self.combined_json_path: str | None = None
        self.combined_html_path: str | None = None  # rank 0's page of the job (--html)

    def per_rank(self, path: str | None) -> str | None:
        return None if path is None else rank_path(path, self.env.rank)

    def start(self, options: dict) -> None:
        """Connects, agrees with the other ranks (``LaunchError`` if they cannot run
        together), and from then on turns SIGTERM into an orderly end."""
        self.channel.open()
        self.channel.handshake(options)
        self.sigterm.install()

    def entering_report(self) -> None:
        """From here on SIGTERM only shortens the waits: the report is being made."""
        self.sigterm.in_report = True

    def finish(self, *, summary: dict, leak_report, exit_code: int | None, files: dict, label: str,
               local_text: str, capture: bytes | None = None, growth_report=None) -> None:
        """Sends this rank's report (and ``capture``, the ``.tmem`` bytes of its capture, for
        the job's HTML page); on rank 0, prints the job's and writes the combined JSON and page.
        ``growth_report``: the rank's ``GrowthReport`` over its training steps, if any."""
        env, out = self.env, sys.stderr
        report = _payload.collect(rank=env.rank, world_size=env.world_size, summary=summary, leaks=leak_report,
                                  growth=growth_report)
        report.exit_code = exit_code
        report.status = "terminated by SIGTERM" if self.sigterm.received else None
        report.files = {kind: path for kind, path in files.items() if path}
        try:
            if capture is not None and env.rank != 0:  # rank 0 has its own at hand
                self.channel.send_capture(capture)
            self.channel.send(_payload.encode(report.to_dict()))
        except Exception as error:  # noqa: BLE001 - the store is gone (rank 0 or the agent died)
            print(local_text, file=out)
            print(f"torchmem: this rank's report could not reach rank 0 ({_one_line(error)}); it is printed "
                  "here instead", file=out)
            out.flush()
            return
        if env.rank != 0:
            print(f"torchmem: rank {env.rank} sent its report to rank 0 ({_brief(report)})", file=out)
            out.flush()
            return
        try:
            reports, missing = self.channel.collect()
        except Exception as error:  # noqa: BLE001
            reports, missing = [report], {rank: f"not collected ({_one_line(error)})" for rank in range(1, env.world_size)}
        job = JobReport(reports, env.world_size, missing, title=f"python -m torchmem run {label}, {env.launcher}")
        lines = ["", "=" * 78, job.render()]
        if self.combined_json_path is not None:
            try:
                with open(self.combined_json_path, "w") as file:
                    json.dump(job.to_dict(), file, indent=2)
                lines += ["", f"job JSON report written to {self.combined_json_path} (one file per rank beside it)"]
            except OSError as error:
                lines.append(f"torchmem: could not write the job JSON report: {error}")
        if self.combined_html_path is not None:
            lines += self._write_job_html(reports, missing, own=capture)
        print("\n".join(lines), file=out)
        out.flush()

    def _write_job_html(self, reports: list, missing: dict[int, str], own: bytes | None) -> list[str]:
        """Rank 0: one HTML page from every rank's capture that arrived (the wait for them was
        the wait for the reports, bounded by --dist-timeout); the lines to print."""
        from torchmem.reports import capture as _capture
        from torchmem.reports import html as _html

        ranks = sorted(report.rank for report in reports)
        try:
            raw = self.channel.captures([rank for rank in ranks if rank != 0])
        except Exception as error:  # noqa: BLE001 - the store went away: the page has what is here
            raw, lost = {}, _one_line(error)
        else:
            lost = None
        if own is not None:
            raw[0] = own
        captures, absent = [], {}
        for rank in ranks:
            if rank not in raw:
                absent[rank] = f"its capture was not received ({lost})" if lost else "it sent no capture"
                continue
            try:
                captures.append(_capture.decode(raw[rank], f"the capture of rank {rank}"))
            except _capture.CaptureFormatError as error:
                absent[rank] = str(error)
        absent.update(missing)
        lines = []
        if captures:
            try:
                combined = _capture.combine_captures(captures)
                # The page names the ranks it lacks too, not only this output.
                combined.data["meta"]["missing_ranks"] = {str(rank): why for rank, why in sorted(absent.items())}
                _html.write_html(self.combined_html_path, combined)
                shown = format_ranks(sorted(c.meta.get("rank") for c in captures if c.meta.get("rank") is not None))
                lines += ["", f"job HTML report written to {self.combined_html_path} ({shown})"]
            except OSError as error:
                lines.append(f"torchmem: could not write the job HTML report: {error}")
        for rank, why in sorted(absent.items()):
            lines.append(f"torchmem: the job HTML report has no section for rank {rank}: {why}")
        return lines


def _brief(report: _payload.RankReport) -> str:
    from torchmem._support.units import format_bytes

    peaks = ", ".join(f"{name} peak {format_bytes(figures['allocated_peak'])}" for name, figures in report.devices.items())
    leaks = "leaks not checked" if report.leaks is None else (
        "no leaks" if not report.leaks["leaked_blocks"] else f"{report.leaks['leaked_blocks']} leaked blocks"
    )
    return ", ".join(part for part in (peaks, leaks) if part)
