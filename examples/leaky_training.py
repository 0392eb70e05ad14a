"""A small training loop with the Composer bug, for `python -m torchmem run`.

    python -m torchmem run examples/leaky_training.py

Every step, the logger copies the metric's tensor state into a report object that
refers to itself: a reference cycle. Only Python's garbage collector frees such
copies, and it does not feel the memory they hold (mosaicml/composer#3153).
torchmem's exit report names the copies, the cycle, and the line that made them.
"""

import gc

import torch
from torch import nn

import torchmem


class RunningLoss:
    """A metric holding tensor state, like a torchmetrics Metric."""

    def __init__(self):
        self.total = torch.zeros(4096)

    def update(self, loss):
        self.total = self.total + loss.detach()


class StepReport:
    def __init__(self, metric):
        self.state = metric.total.clone()  # a copy of the metric's state, every step
        self.me = self  # the reference cycle: freed only by gc


def main(steps: int = 20) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    metric = RunningLoss()
    for _ in range(steps):
        with torchmem.tag("train"):
            x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torchmem.tag("logging"):
            metric.update(loss)
            StepReport(metric)  # logged and dropped... but never freed
        if _ == 0:
            # Long jobs rarely collect their oldest objects; model that by stopping the
            # collector after the first step (which imports parts of torch lazily).
            gc.collect()
            gc.disable()
    print(f"trained {steps} steps; last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
