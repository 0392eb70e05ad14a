"""``run``'s growth check: a ``torchmem.GrowthMonitor`` stepped at the end of every
training step (:mod:`.steps` finds them), and the part of the exit report it writes."""

from __future__ import annotations

from torchmem.integrations.runner.steps import StepWatcher

# Steps whose growth is expected: the first steps build optimizer state, caches, pools.
WARMUP_STEPS = 2


class TrainingGrowth:
    """Memory per step of the script's training loop: which tags and sites grew."""

    def __init__(self, step_on: list[str] = (), script_module: str | None = None):
        import torchmem

        self.monitor = torchmem.GrowthMonitor(warmup=WARMUP_STEPS)
        self.watcher = StepWatcher(self.monitor.step, step_on, script_module)
        self._report = None

    def start(self) -> None:
        self.watcher.start()

    def stop(self) -> None:
        """Stops watching (before the script's globals are released) and judges the steps."""
        self.watcher.stop()
        self.monitor.stop()
        if self.watcher.steps:
            self._report = self.monitor.report()

    @property
    def report(self):
        """The ``GrowthReport`` over the steps (after ``stop()``), or None when no step was seen."""
        return self._report

    @property
    def has_growth(self) -> bool:
        return self._report is not None and self._report.has_growth

    def render(self) -> str:
        steps, source = self.watcher.steps, self.watcher.source
        lines = []
        if steps == 0:
            how = (
                "no torch.optim optimizer stepped; name the function that ends a step with "
                "--step-on module:function" if source == "optimizer" else "no --step-on function returned"
            )
            lines.append(f"growth per training step: no step seen ({how})")
        else:
            origin = "optimizer.step() calls" if source == "optimizer" else "returns of the --step-on function(s)"
            lines.append(f"growth per training step: {steps} steps ({origin}), the first {WARMUP_STEPS} as warm-up")
            lines.append(self._report.render())
        lines += [f"torchmem: --step-on {spec}: {why}" for spec, why in self.watcher.unresolved.items()]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "steps": self.watcher.steps,
            "step_source": self.watcher.source,
            "unresolved_step_on": dict(self.watcher.unresolved),
            "report": None if self._report is None else self._report.to_dict(),
        }
