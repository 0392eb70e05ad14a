"""When memory held only by reference cycles counts as leaked (torchmem.leaks.cycle_policy).

An object that lives in a cycle by design (every torchmetrics Metric, through
functools.wraps) is reported, not counted; cycle garbage that repeats (a new cycle left by
the same allocation stack and holder type, step after step) is counted: the Composer bug.
"""

from __future__ import annotations

import functools
import gc

import pytest
import torch

import torchmem
from leak_helpers import collector_paused, torchmem_cpu  # noqa: F401


class MetricLike:
    """Refers to itself as torchmetrics' Metric does: ``update`` wraps the bound method."""

    def __init__(self):
        self.total = torch.zeros(128)
        self.update = self._wrap(self.update)  # update.__wrapped__.__self__ is self

    def _wrap(self, update):
        @functools.wraps(update)
        def wrapped(*args):
            return update(*args)

        return wrapped

    def update(self, value: torch.Tensor) -> None:
        self.total = self.total + value


class Wrapper:
    """Holds several metric-like objects, and is in a cycle itself, as torchmetrics'
    BootStrapper is (a Metric): dropped, it is the one top above all its copies' cycles, so
    they count once. (MetricTracker and MetricCollection are in no cycle: reference counting
    frees them and their copies count like a loop's.)"""

    def __init__(self, count: int):
        self.metrics = [MetricLike() for _ in range(count)]
        self.me = self


def build_and_drop_one_metric() -> None:
    metric = MetricLike()
    metric.update(torch.ones(128))


def build_and_drop_metrics_in_a_loop(steps: int) -> None:
    for _ in range(steps):
        build_and_drop_one_metric()  # each iteration drops one cycle: garbage piles up


def build_and_drop_a_wrapper(count: int) -> None:
    wrapper = Wrapper(count)
    for metric in wrapper.metrics:
        metric.update(torch.ones(128))


def test_an_object_that_lives_in_a_cycle_by_design_is_reported_and_not_counted():
    with collector_paused(), torchmem.leak_check() as report:  # would raise if counted
        build_and_drop_one_metric()

    assert report.leaked == [] and not report.has_leaks
    assert report.cycle and report.uncounted_cycles == report.cycle
    for finding in report.cycle:
        assert not finding.counted
        assert finding.note.startswith("not counted: 1 separate cycle held by MetricLike")
        assert "MetricLike.update.__wrapped__.__self__ is the same MetricLike" == finding.cycle
    assert "cycle garbage not counted" in report.render().splitlines()[0]
    assert "cycle, not counted" in report.render()


def test_the_same_stack_and_holder_type_leaving_a_cycle_every_iteration_is_counted():
    with collector_paused(), pytest.raises(torchmem.LeakError) as raised:
        with torchmem.leak_check():
            build_and_drop_metrics_in_a_loop(steps=8)

    report = raised.value.report
    assert report.cycle and all(finding.counted for finding in report.cycle)
    assert all(finding.note.startswith("counted: 8 separate cycles held by MetricLike") for finding in report.cycle)


def test_fewer_iterations_than_the_default_of_eight_are_not_counted():
    # As many separate cycles as a test that builds several objects of one kind and drops
    # them together at its end (a tracker after a few increments) leaves.
    with collector_paused(), torchmem.leak_check() as report:
        build_and_drop_metrics_in_a_loop(steps=7)

    assert report.cycle and not report.leaked


def test_cycle_repeats_sets_how_many_separate_cycles_count():
    with collector_paused(), torchmem.leak_check(raise_on_leak=False, cycle_repeats=2) as report:
        build_and_drop_metrics_in_a_loop(steps=2)

    assert report.cycle and all(finding.counted for finding in report.cycle)


def test_many_cycles_held_together_by_one_wrapper_are_one_island_and_not_counted():
    with collector_paused(), torchmem.leak_check() as report:
        build_and_drop_a_wrapper(count=10)

    assert len(report.cycle) == 10  # each metric's updated total (the first ones were replaced)
    assert report.leaked == []


def test_a_reused_check_judges_each_entry_on_its_own():
    # One metric per call of a checked evaluate(): a by-design cycle per call, collected at
    # every exit, never piles up. The second call is no more a leak than the first.
    @torchmem.leak_check()  # raises on a leak
    def evaluate():
        build_and_drop_one_metric()

    with collector_paused():
        for _ in range(4):
            evaluate()

    check = torchmem.leak_check(raise_on_leak=False)
    reports = []
    with collector_paused():
        for _ in range(3):
            with check as report:
                build_and_drop_one_metric()
            reports.append(report)
    for report in reports:
        assert report.cycle and report.leaked == []
        assert report.cycle[0].note.startswith("not counted: 1 separate cycle held by MetricLike")
        assert report.render().startswith("torchmem.leak_check: no leaks; cycle garbage not counted")


def test_a_reused_check_still_counts_a_loop_inside_one_entry():
    check = torchmem.leak_check(raise_on_leak=False)
    with collector_paused():
        with check as first:
            build_and_drop_one_metric()
        with check as second:
            build_and_drop_metrics_in_a_loop(steps=8)

    assert first.leaked == []
    assert second.cycle and second.leaked == second.cycle


def drop_instances_of_a_class_defined_here(steps: int) -> None:
    """As a script run under ``python -m torchmem run`` does once its globals are released:
    the class itself becomes garbage with its instances, and every instance refers to it."""

    class StepReport:
        def __init__(self, state):
            self.state = state.clone()  # a copy per step
            self.me = self  # the cycle

    state = torch.zeros(256)
    for _ in range(steps):
        StepReport(state)
    del StepReport  # now only the instances (and the class's own cycle) refer to the class


def test_copies_that_share_only_their_class_are_separate_cycles():
    with collector_paused(), pytest.raises(torchmem.LeakError) as raised:
        with torchmem.leak_check():
            drop_instances_of_a_class_defined_here(steps=10)

    report = raised.value.report
    assert len(report.cycle) == 10 and report.leaked == report.cycle
    assert report.cycle[0].note.startswith(
        "counted: 10 separate cycles held by drop_instances_of_a_class_defined_here.<locals>.StepReport"
    )
    assert report.render().startswith(
        "torchmem.leak_check: 10.0 KiB in 10 blocks allocated inside are still alive (cycle 10.0 KiB in 10 blocks)"
    )


class SharedDefaultHolder:
    def __init__(self, state, options={"shared": True}):  # noqa: B006 - the shared default is the point
        self.options = options  # every copy refers to the same dict
        self.state = state.clone()
        self.me = self


def test_copies_that_share_a_default_and_a_function_are_separate_cycles():
    def step(state, log=lambda value: value):  # a function every copy refers to
        holder = SharedDefaultHolder(state)
        holder.log = log

    state = torch.zeros(256)
    with collector_paused(), torchmem.leak_check(raise_on_leak=False) as report:
        for _ in range(9):
            step(state)
        del step

    assert len(report.cycle) == 9 and report.leaked == report.cycle
    assert report.cycle[0].note.startswith("counted: 9 separate cycles held by SharedDefaultHolder")


def test_warmup_entries_do_not_start_the_repetition():
    check = torchmem.leak_check(raise_on_leak=False, warmup=1)
    with collector_paused():
        with check as warm:
            build_and_drop_one_metric()
        with check as first_checked:
            build_and_drop_one_metric()

    assert warm.leaked == [] and {finding.kind for finding in warm.findings} == {"allowed"}
    assert first_checked.cycle and first_checked.leaked == []


@pytest.mark.parametrize("policy, counted", [("always", True), ("never", False)])
def test_always_counts_every_cycle_and_never_counts_none(policy, counted):
    steps = 1 if counted else 10
    with collector_paused(), torchmem.leak_check(raise_on_leak=False, cycles=policy) as report:
        build_and_drop_metrics_in_a_loop(steps=steps)

    assert report.cycle and all(finding.counted is counted for finding in report.cycle)
    assert report.cycle_policy == policy


def test_a_collection_due_while_the_check_exits_does_not_hide_a_cycle():
    # The exit allocates (survivor records, lists) before its own collection. With the
    # collector's count at its threshold, an automatic collection there would free the
    # cycle unseen, and the report would say nothing: the exit pauses the collector first.
    with torchmem.leak_check(raise_on_leak=False):
        pass  # the exit's code has run once (Python 3.10 then reuses its frames)
    threshold = gc.get_threshold()
    try:
        with collector_paused(), torchmem.leak_check(raise_on_leak=False, cycles="always") as report:
            build_and_drop_one_metric()
            gc.enable()
            gc.set_threshold(1)  # the next tracked allocation collects
    finally:
        gc.set_threshold(*threshold)

    assert len(report.cycle) == 1 and report.cycle[0].counted
    assert gc.isenabled()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"cycles": "sometimes"}, "cycles must be 'repeating'"),
        ({"cycles": 3}, "cycles must be 'repeating'"),
        ({"cycle_repeats": 1}, "cycle_repeats must be an int >= 2"),
        ({"cycle_repeats": "three"}, "cycle_repeats must be an int >= 2"),
        ({"cycle_repeats": True}, "cycle_repeats must be an int >= 2"),
    ],
)
def test_bad_cycle_options_are_refused_with_what_to_pass(options, message):
    with pytest.raises(ValueError, match=message):
        torchmem.leak_check(**options)


def test_untagged_is_a_tag_allow_tags_accepts():
    with torchmem.leak_check(allow_tags="untagged", raise_on_leak=False) as report:
        KEPT.append(torch.zeros(1000))
        with torchmem.tag("cache"):
            KEPT.append(torch.zeros(1000))

    assert [finding.kind for finding in report.findings].count("allowed") == 1
    assert report.allowed[0].note == "tag 'untagged' is allowed"
    assert [finding.tag for finding in report.reachable] == ["cache"]
    KEPT.clear()


KEPT: list = []


def test_untagged_cannot_be_opened_as_a_tag():
    with pytest.raises(ValueError, match="'untagged' is the name torchmem gives memory allocated outside every tag"):
        torchmem.tag("untagged")


def test_blocks_whose_holder_is_unknown_are_not_counted_as_separate_copies():
    # zuko's test_bayesian_flows: 40 blocks allocated at one `loss.backward()` line, freed by the
    # collection, no tensor using them in the garbage. Nothing says they were dropped one by one.
    from torchmem.leaks import cycle_policy

    unknown = [(index, (7, ""), frozenset({("unknown", index)})) for index in range(40)]
    known = [(100 + index, (8, "StepReport"), frozenset({("top", index)})) for index in range(8)]
    verdicts = cycle_policy.judge(unknown + known, policy="repeating", repeats=8)

    assert not any(verdicts[index].counted for index, _, _ in unknown)
    assert "no tensor using it was found" in verdicts[0].note
    assert all(verdicts[index].counted for index, _, _ in known)  # a loop's copies still count
    always = cycle_policy.judge(unknown, policy="always", repeats=8)
    assert all(verdict.counted for verdict in always.values())
