"""The soak, CI-sized: thousands of training steps, and nothing in torchmem drifts.

The loop and its checks live in ``benchmarks/soak.py`` (whose long version is the
documented command ``PYTHONPATH=. python benchmarks/soak.py --minutes 30``); here it runs
bounded by step count, in seconds. The checks are tested too, on fabricated figures, so
that a soak that passes means something.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from leak_helpers import torchmem_cpu  # noqa: F401  (autouse: torchmem serves CPU tensors)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import soak  # noqa: E402

MiB = 1 << 20


def assert_soaked_cleanly(result: soak.SoakResult, steps: int, epochs: int) -> None:
    print(result.render())  # the figures, in the test log
    assert result.ok, result.render()
    assert (result.steps, result.epochs) == (steps, epochs)
    config = result.config
    assert result.leak_checks == steps // config.check_every
    assert result.invariant_checks == epochs  # invariants and the recount after every epoch
    # Live bytes: the same at the end of every epoch once warm (Adam's state and nothing else).
    assert len(set(result.live_bytes[config.warmup_epochs - 1:])) == 1
    assert result.live_bytes[-1] > 0
    # torchmem's own bookkeeping: not one more tag or segment after warm-up, and the stack
    # table at most a few rare paths larger (see soak.STACK_SLACK).
    for key in soak.EXACT:
        assert result.at_end[key] == result.at_warmup[key], key
    for key, slack in soak.STACK_SLACK.items():
        assert result.at_end[key] <= result.at_warmup[key] + slack, key
    assert result.at_warmup["interned_stacks"] > 0  # stacks were captured all along
    assert result.rss_drift <= config.rss_bound


def test_three_thousand_steps_keep_stats_exact_live_bytes_flat_and_bookkeeping_bounded():
    result = soak.run_soak(soak.SoakConfig(steps=3000))
    assert_soaked_cleanly(result, steps=3000, epochs=30)


def test_the_soak_with_forked_dataloader_workers_is_as_steady():
    result = soak.run_soak(soak.SoakConfig(steps=1200, steps_per_epoch=50, workers=2))
    assert_soaked_cleanly(result, steps=1200, epochs=24)


# --- the checks can fail ---------------------------------------------------------------------------


class FakeEngine:
    """An engine whose statistics say one thing and whose segments another."""

    def __init__(self, stats: dict, segments: list):
        self._stats, self._segments = stats, segments

    def memory_stats(self) -> dict:
        return dict(self._stats)

    def segments(self) -> list:
        return self._segments


def block(size: int, state: str, requested: int | None = None) -> dict:
    return {"size": size, "state": state, "requested_size": size if requested is None else requested}


def test_the_recount_matches_real_statistics_and_names_every_key_that_does_not():
    from torchmem import _C

    engine = _C.cpu_engine()
    assert soak.stats_mismatches(engine) == []

    segments = [{"pool": "small_pool", "size": 2 * MiB, "blocks": [block(512, "allocated", 100), block(2 * MiB - 512, "free")]}]
    honest = soak.recount(FakeEngine({}, segments))
    assert honest["allocated_bytes.small_pool.current"] == 512
    assert honest["requested_bytes.all.current"] == 100
    assert honest["inactive_split_bytes.all.current"] == 2 * MiB - 512
    assert honest["reserved_bytes.large_pool.current"] == 0

    lying = dict(honest, **{"allocated_bytes.all.current": 1024})
    assert soak.stats_mismatches(FakeEngine(lying, segments)) == [
        "allocated_bytes.all.current: memory_stats says 1024, the blocks add up to 512"
    ]


def judged(**figures) -> soak.SoakResult:
    config = soak.SoakConfig(steps=600, steps_per_epoch=100, warmup_epochs=2)
    steady = {key: 10 for key in (*soak.EXACT, *soak.STACK_SLACK)} | {"rss": 500 * MiB, "private": 300 * MiB}
    result = soak.SoakResult(
        config=config, epochs=6, live_bytes=figures.get("live_bytes", [7, 9, 9, 9, 9, 9]),
        at_warmup=dict(steady), at_end=dict(steady, **figures.get("at_end", {})),
    )
    soak._judge(result)
    return result


def test_judging_passes_a_steady_run():
    assert judged().problems == []


def test_judging_flags_live_bytes_that_drift_after_warm_up():
    (problem,) = judged(live_bytes=[7, 9, 9, 10, 11, 12]).problems
    assert problem.startswith("live bytes drift after warm-up")


def test_judging_tolerates_a_few_late_stacks_but_flags_a_stack_table_that_keeps_growing():
    assert judged(at_end={"interned_stacks": 12}).problems == []  # two rare paths, interned once
    (problem,) = judged(at_end={"interned_stacks": 19}).problems
    assert problem == (
        "torchmem's stack table kept growing after warm-up: interned_stacks 10 -> 19 (more than 8 more)"
    )


def test_judging_flags_a_new_tag_after_warm_up():
    (problem,) = judged(at_end={"engine_tags": 11}).problems
    assert problem == "torchmem's bookkeeping grew after warm-up: engine_tags 10 -> 11"


def test_judging_flags_rss_growth_beyond_the_bound():
    (problem,) = judged(at_end={"rss": 600 * MiB}).problems
    assert problem.startswith("RSS grew by 100.0 MiB after warm-up (bound 32.0 MiB)")


def test_a_soak_too_short_to_judge_is_refused():
    with pytest.raises(ValueError, match="too few to judge drift: need at least 11 epochs"):
        soak.run_soak(soak.SoakConfig(steps=1000, steps_per_epoch=100))
    with pytest.raises(ValueError, match="warmup_epochs must be >= 1"):
        soak.run_soak(soak.SoakConfig(warmup_epochs=0))


def test_the_documented_command_runs_and_writes_its_figures(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--steps", "600", "--steps-per-epoch", "50",
         "--batch-size", "8", "--json", "soak.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("soak: 600 steps in 12 epochs")
    figures = json.loads((tmp_path / "soak.json").read_text())
    assert figures["ok"] and figures["steps"] == 600
    assert figures["at_end"]["engine_tags"] == figures["at_warmup"]["engine_tags"] == 5
