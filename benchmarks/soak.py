"""Soak: thousands of training steps under torchmem, checking that nothing drifts.

    # from the repository root (torchmem is used in place: PYTHONPATH=.)
    PYTHONPATH=. python benchmarks/soak.py --steps 200000             # the long run
    PYTHONPATH=. python benchmarks/soak.py --minutes 30 --workers 2   # by time, with DataLoader workers
    PYTHONPATH=. python benchmarks/soak.py --steps 3000 --json soak.json

tests/python/test_soak.py runs the same loop CI-sized (a few thousand steps).

The loop: a small MLP trained with Adam on synthetic data, every tensor on the CPU and
allocated by torchmem (``torchmem.install("cpu")``); batches from a
``torch.utils.data.DataLoader`` (in-process by default, ``--workers N`` forks
persistent workers); every step tagged by phase (``data``, ``forward``, ``backward``,
``optimizer``); one step in every ``--check-every`` inside a ``torchmem.leak_check``
that raises on any leak; a ``torchmem.GrowthMonitor`` (by tag and by allocation site,
so stack capture is on for the whole run) stepped once per epoch.

What is checked, and when:

* at the end of every epoch, the engine's invariant checker
  (``_C.cpu_engine().check_invariants()``: every byte of every segment in exactly one
  block, free blocks merged, counters equal to a recount), and torchmem's statistics
  (``memory_stats()``) against an independent recount of ``engine.segments()``:
  reserved, allocated, active, requested and inactive-split bytes, segment and
  allocation counts, per pool;
* live bytes do not drift: after the warm-up epochs, ``allocated_bytes.all.current``
  at the end of every epoch equals its value at the end of warm-up;
* torchmem's own bookkeeping stays bounded: interned stacks, distinct frames, code
  objects held and bytes of the stack table (``torchmem.stacks.capture.stats()``), the tags the
  engine tracks, and the process's RSS (growth after warm-up within ``--rss-bound``);
* every leak check after the first (which sees Adam create its state) finds nothing,
  and the growth monitor reports no growing tag or site.

Prints the figures (steps, wall time, bookkeeping at the end of warm-up and at the end,
RSS drift) and exits 1 if any check failed. Never asserts on time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
from torch.utils.data import DataLoader, Dataset

import torchmem
from torchmem.stacks import capture as stack_capture
from torchmem.stacks import frames as stack_frames
from torchmem import _C
from torchmem._support.units import format_bytes

FEATURES = 32
CLASSES = 10
MiB = 1 << 20


# --- the workload --------------------------------------------------------------------------------


class SyntheticDataset(Dataset):
    """Deterministic classification samples made on demand (each item allocates its tensors)."""

    def __init__(self, length: int):
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(FEATURES, generator=generator)
        y = int(x[:CLASSES].argmax())
        return x, y


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, CLASSES),
    )


def train_step(model, optimizer, x, y) -> float:
    """One tagged step. Gradients are released after the update, so a step leaves nothing
    alive but the optimizer's state (created by the first step)."""
    with torchmem.tag("forward"):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    with torchmem.tag("backward"):
        loss.backward()
    with torchmem.tag("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.item()


# --- checks --------------------------------------------------------------------------------------


def recount(engine) -> dict[str, int]:
    """The figures ``memory_stats()`` reports, recounted from the engine's segments and blocks."""
    counts: dict[str, int] = {}

    def add(key: str, pool: str, value: int) -> None:
        for scope in ("all", pool):
            name = f"{key}.{scope}.current"
            counts[name] = counts.get(name, 0) + value

    for pool in ("small_pool", "large_pool"):  # every key present, zero included
        for key in ("segment", "reserved_bytes", "allocation", "allocated_bytes", "active", "active_bytes",
                    "requested_bytes", "inactive_split", "inactive_split_bytes"):
            add(key, pool, 0)
    for segment in engine.segments():
        pool = segment["pool"]
        add("segment", pool, 1)
        add("reserved_bytes", pool, segment["size"])
        blocks = segment["blocks"]
        for block in blocks:
            state = block["state"]
            if state == "allocated":
                add("allocation", pool, 1)
                add("allocated_bytes", pool, block["size"])
                add("requested_bytes", pool, block["requested_size"])
            if state in ("allocated", "pending"):
                add("active", pool, 1)
                add("active_bytes", pool, block["size"])
            if state == "free" and len(blocks) > 1:  # free space inside a segment still in use
                add("inactive_split", pool, 1)
                add("inactive_split_bytes", pool, block["size"])
    return counts


def stats_mismatches(engine) -> list[str]:
    """Keys where ``memory_stats()`` and the recount disagree, as readable lines."""
    stats = engine.memory_stats()
    counted = recount(engine)
    return [
        f"{key}: memory_stats says {stats.get(key)}, the blocks add up to {value}"
        for key, value in sorted(counted.items())
        if stats.get(key) != value
    ]


def bookkeeping(engine) -> dict[str, int]:
    """The size of torchmem's own bookkeeping and of the process, now."""
    stacks = stack_capture.stats()
    memory = torchmem.rss_report(children=False).main
    return {
        "stacks_interned_total": stacks["stacks_interned_total"],  # = the newest stack's id
        "interned_stacks": stacks["interned_stacks"],
        "distinct_frames": stacks["distinct_frames"],
        "code_objects_held": stacks["code_objects_held"],
        "stack_table_bytes": stacks["bytes_used"],
        "engine_tags": len(engine.tag_stats()),
        "segments": len(engine.segments()),
        "rss": memory.rss,
        "private": memory.private,
    }


# Bookkeeping figures that must not change at all after warm-up in a steady loop.
EXACT = ("engine_tags", "segments")
# Stack-table figures may still rise a little after warm-up, and must then stop: a code
# path taken only on a rare event is interned when it first happens. With DataLoader
# workers, a batch that arrives out of order makes the main process advance the sampler
# (whose randperm allocates) from another line of DataLoader's code, hours into a run.
# Unbounded growth (a new stack per step or per epoch) exceeds these slacks within a few
# epochs; a soak must run at least that long after warm-up (see SoakConfig.validate).
STACK_SLACK = {"interned_stacks": 8, "distinct_frames": 16, "code_objects_held": 8, "stack_table_bytes": 8 << 10}


# --- the run -------------------------------------------------------------------------------------


@dataclass
class SoakConfig:
    steps: int = 3000
    minutes: float | None = None  # stop after this long too (whichever comes first)
    batch_size: int = 32
    steps_per_epoch: int = 100
    warmup_epochs: int = 2
    check_every: int = 50  # one step in this many runs inside a leak check
    workers: int = 0  # DataLoader worker processes (forked, persistent); 0: in-process
    rss_bound: int = 32 * MiB  # RSS growth tolerated after warm-up
    # Intra-op threads. One by default: the model is tiny, and on a shared machine
    # OpenMP's spinning threads make each step ~50x slower without changing what is checked.
    threads: int = 1

    def validate(self) -> None:
        for name in ("steps", "batch_size", "steps_per_epoch", "check_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"soak: {name} must be an int >= 1, got {value!r}")
        if self.warmup_epochs < 1:
            raise ValueError(f"soak: warmup_epochs must be >= 1 (the first epoch builds the optimizer's state), "
                             f"got {self.warmup_epochs!r}")
        if self.threads < 1:
            raise ValueError(f"soak: threads must be >= 1, got {self.threads!r}")
        if self.workers < 0:
            raise ValueError(f"soak: workers must be >= 0, got {self.workers!r}")
        if self.minutes is not None and self.minutes <= 0:
            raise ValueError(f"soak: minutes must be > 0, got {self.minutes!r}")
        # Warm-up plus enough epochs for a stack table growing by one stack per epoch to
        # exceed its slack (STACK_SLACK): shorter runs could not tell bounded from unbounded.
        needed = self.warmup_epochs + STACK_SLACK["interned_stacks"] + 1
        if self.steps < needed * self.steps_per_epoch:
            raise ValueError(
                f"soak: {self.steps} steps are too few to judge drift: need at least {needed} epochs of "
                f"{self.steps_per_epoch} steps (warm-up plus {needed - self.warmup_epochs})"
            )


@dataclass
class SoakResult:
    config: SoakConfig
    steps: int = 0
    epochs: int = 0
    seconds: float = 0.0
    leak_checks: int = 0
    invariant_checks: int = 0
    live_bytes: list = field(default_factory=list)  # allocated bytes at the end of each epoch
    rss: list = field(default_factory=list)  # RSS at the end of each epoch
    at_start: dict = field(default_factory=dict)  # bookkeeping before the first step
    at_warmup: dict = field(default_factory=dict)  # ... at the end of warm-up
    at_end: dict = field(default_factory=dict)  # ... at the end of the last complete epoch
    growth: str = ""
    late_stacks: list = field(default_factory=list)  # stacks first interned after warm-up, symbolized
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def rss_drift(self) -> int:
        """RSS at the end minus RSS at the end of warm-up."""
        return self.at_end.get("rss", 0) - self.at_warmup.get("rss", 0)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["ok"] = self.ok
        data["rss_drift"] = self.rss_drift
        return data

    def render(self) -> str:
        config = self.config
        lines = [
            f"soak: {self.steps} steps in {self.epochs} epochs, {self.seconds:.1f} s wall "
            f"({'in-process data' if not config.workers else f'{config.workers} forked DataLoader workers'}, "
            f"batch {config.batch_size}, warm-up {config.warmup_epochs} epochs)",
            f"  leak checks: {self.leak_checks} (one step in {config.check_every}); invariant + recount checks: "
            f"{self.invariant_checks}",
            f"  live bytes at the end of each epoch after warm-up: "
            f"{sorted(set(self.live_bytes[config.warmup_epochs - 1:]))}",
            f"  {'bookkeeping':<24} {'start':>10} {'end of warm-up':>16} {'end':>12}",
        ]
        for key in self.at_end:
            show = format_bytes if key in ("rss", "private", "stack_table_bytes") else str
            start, warm, end = (show(figures.get(key, 0)) for figures in (self.at_start, self.at_warmup, self.at_end))
            lines.append(f"    {key:<22} {start:>10} {warm:>16} {end:>12}")
        lines.append(f"  RSS drift after warm-up: {'+' if self.rss_drift >= 0 else '-'}{format_bytes(abs(self.rss_drift))} "
                     f"(bound {format_bytes(config.rss_bound)}); per-epoch RSS range after warm-up: "
                     f"{format_bytes(max(self.rss[config.warmup_epochs - 1:], default=0) - min(self.rss[config.warmup_epochs - 1:], default=0))}")
        if self.late_stacks:
            lines.append(f"  stacks first seen after warm-up ({len(self.late_stacks)}):")
            lines += [f"    {stack}" for stack in self.late_stacks]
        lines.append(f"  growth monitor: {self.growth}")
        lines.append("  result: " + ("all checks passed" if self.ok else f"{len(self.problems)} problem(s)"))
        lines += [f"    - {problem}" for problem in self.problems]
        return "\n".join(lines)


def run_soak(config: SoakConfig) -> SoakResult:
    """Runs the loop; returns the figures and every check that failed (``problems``)."""
    config.validate()
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _run(config)
    finally:
        torch.set_num_threads(threads)


def _run(config: SoakConfig) -> SoakResult:
    torchmem.install("cpu")
    engine = _C.cpu_engine()
    result = SoakResult(config=config)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(
        SyntheticDataset(config.steps_per_epoch * config.batch_size), batch_size=config.batch_size, shuffle=True,
        num_workers=config.workers, persistent_workers=config.workers > 0,
        multiprocessing_context="fork" if config.workers else None,
    )
    check = torchmem.leak_check(warmup=1)  # raises torchmem.LeakError on any later leak
    deadline = None if config.minutes is None else time.monotonic() + 60 * config.minutes
    result.at_start = bookkeeping(engine)
    started = time.perf_counter()

    def out_of_budget() -> bool:
        return result.steps >= config.steps or (deadline is not None and time.monotonic() >= deadline)

    with torchmem.GrowthMonitor(warmup=config.warmup_epochs) as monitor:
        while not out_of_budget() and result.ok:
            batches = iter(loader)
            completed = True
            for _ in range(len(loader)):
                if out_of_budget():
                    completed = False
                    break
                with torchmem.tag("data"):
                    x, y = next(batches)
                if result.steps % config.check_every == 0:
                    result.leak_checks += 1
                    try:
                        with check:
                            train_step(model, optimizer, x, y)
                    except torchmem.LeakError as error:
                        result.problems.append(f"step {result.steps}: the leak check found a leak:\n{error}")
                        completed = False
                        break
                else:
                    train_step(model, optimizer, x, y)
                del x, y
                result.steps += 1
            del batches
            if not completed:
                break  # a partial epoch (or a leak): its end is not comparable with the others
            result.epochs += 1
            _end_of_epoch(engine, result, monitor)
        result.growth = monitor.report().render()
        if monitor.report().has_growth:
            result.problems.append(f"the growth monitor found growth:\n{result.growth}")
    result.seconds = time.perf_counter() - started
    result.late_stacks = late_stacks(result.at_warmup, result.at_end)
    _judge(result)
    return result


def late_stacks(at_warmup: dict, at_end: dict, limit: int = 8) -> list[str]:
    """The stacks interned after warm-up (ids are handed out in order, from 1), each as its
    three innermost frames: what made the table grow, if it did."""
    first, last = at_warmup.get("stacks_interned_total", 0) + 1, at_end.get("stacks_interned_total", 0)
    out = []
    for context in range(first, min(last, first + limit - 1) + 1):
        frames = stack_frames.frames(context)[:3]
        out.append(" <- ".join(f"{frame.filename.rsplit('/', 1)[-1]}:{frame.line} {frame.name}" for frame in frames))
    if last - first + 1 > limit:
        out.append(f"... and {last - first + 1 - limit} more")
    return out


def _end_of_epoch(engine, result: SoakResult, monitor) -> None:
    config = result.config
    try:
        engine.check_invariants()
    except RuntimeError as error:
        result.problems.append(f"epoch {result.epochs}: the invariant checker failed: {error}")
    for line in stats_mismatches(engine):
        result.problems.append(f"epoch {result.epochs}: {line}")
    result.invariant_checks += 1
    monitor.step()
    result.live_bytes.append(engine.memory_stats()["allocated_bytes.all.current"])
    figures = bookkeeping(engine)
    result.rss.append(figures["rss"])
    if result.epochs == config.warmup_epochs:
        result.at_warmup = figures
    result.at_end = figures


def _judge(result: SoakResult) -> None:
    config = result.config
    if result.epochs <= config.warmup_epochs + 1:
        result.problems.append(
            f"only {result.epochs} complete epochs ran (warm-up {config.warmup_epochs}): too few to judge drift; "
            "give more --steps or --minutes"
        )
        return
    settled = result.live_bytes[config.warmup_epochs - 1:]
    if len(set(settled)) != 1:
        result.problems.append(f"live bytes drift after warm-up (allocated bytes at each epoch end): {settled}")
    for key in EXACT:
        if result.at_end[key] != result.at_warmup[key]:
            result.problems.append(
                f"torchmem's bookkeeping grew after warm-up: {key} {result.at_warmup[key]} -> {result.at_end[key]}"
            )
    for key, slack in STACK_SLACK.items():
        if result.at_end[key] > result.at_warmup[key] + slack:
            result.problems.append(
                f"torchmem's stack table kept growing after warm-up: {key} {result.at_warmup[key]} -> "
                f"{result.at_end[key]} (more than {slack} more)"
            )
    if result.rss_drift > config.rss_bound:
        result.problems.append(
            f"RSS grew by {format_bytes(result.rss_drift)} after warm-up (bound {format_bytes(config.rss_bound)})"
        )


# --- command line --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default 3000; unlimited when only --minutes is given)")
    parser.add_argument("--minutes", type=float, default=None, help="also stop after this many minutes")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (default 0)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps-per-epoch", type=int, default=100)
    parser.add_argument("--check-every", type=int, default=50, help="one step in N runs in a leak check")
    parser.add_argument("--rss-bound-mib", type=float, default=32, help="RSS growth tolerated after warm-up")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    steps = args.steps if args.steps is not None else (3000 if args.minutes is None else sys.maxsize)
    config = SoakConfig(
        steps=steps, minutes=args.minutes, workers=args.workers, threads=args.threads, batch_size=args.batch_size,
        steps_per_epoch=args.steps_per_epoch, check_every=args.check_every,
        rss_bound=int(args.rss_bound_mib * MiB),
    )
    try:
        result = run_soak(config)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    print(result.render())
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result.to_dict(), file, indent=2)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
