"""What ``torchmem.track(model, optimizer)`` costs a training step: the same step timed with
and without tracking, alternating in one process, on CPU tensors served by torchmem.

    python benchmarks/track_cost.py                       # both models, 5 rounds of 30 steps
    python benchmarks/track_cost.py --model transformer --rounds 7 --steps 50 --threads 1

Models: ``tiny`` (4 Linear layers 64 wide, batch 8: a step that is mostly Python, the
worst case for tracking's hooks), ``deep`` (32 Linear layers 16 wide: the cost per
tracked module), ``mlp`` (4 Linear layers, 1024 wide, batch 256) and ``transformer``
(``torch.nn.TransformerEncoder``, PyTorch's own layers: 4 layers, d_model 256, 4 heads,
batch 16 x 128 tokens), each with Adam. A round times ``--steps`` steps untracked, then
the same number tracked (``track`` then ``stop``), and tracked with ``modules=False``
(hooks on the model only), after warm-up steps; the order rotates every round so drift on
a shared machine falls on each. Prints per round the median step time of each, then per
variant the median of its ratios to untracked and of its difference in microseconds.

``--trace`` also records the trace (``torchmem.record_trace``) in both halves, so the
tracked half takes its timeline samples at forward ends and optimizer steps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import torchmem


def _mlp():
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10),
    )
    batch = torch.randn(256, 512)
    return model, lambda: model(batch).square().mean()


def _transformer():
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True,
                                             dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
    batch = torch.randn(16, 128, 256)
    return model, lambda: model(batch).square().mean()


def _tiny():
    # Compute so small that the step is mostly Python: the worst case for tracking's hooks.
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    batch = torch.randn(8, 64)
    return model, lambda: model(batch).square().mean()


def _deep():
    # Many small layers: the cost per tracked module shows.
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(32)])
    batch = torch.randn(4, 16)
    return model, lambda: model(batch).square().mean()


MODELS = {"tiny": _tiny, "deep": _deep, "mlp": _mlp, "transformer": _transformer}
# What a round times, each the same number of steps: untracked, track(model, optimizer),
# and track(..., modules=False) (hooks on the model only, not on every submodule).
VARIANTS = ("untracked", "tracked", "modules=False")


def _steps(loss_fn, optimizer, count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        loss = loss_fn()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times


def measure(name: str, rounds: int, steps: int, warmup: int) -> list[float]:
    model, loss_fn = MODELS[name]()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    _steps(loss_fn, optimizer, warmup)
    ratios: dict[str, list] = {variant: [] for variant in VARIANTS[1:]}
    differences: dict[str, list] = {variant: [] for variant in VARIANTS[1:]}
    for index in range(rounds):
        times = {}
        # Rotate the order every round, so drift on a shared machine falls on every variant.
        order = VARIANTS[index % len(VARIANTS):] + VARIANTS[: index % len(VARIANTS)]
        for variant in order:
            tracking = None
            if variant != "untracked":
                tracking = torchmem.track(model, optimizer, modules=variant == "tracked")
            try:
                times[variant] = statistics.median(_steps(loss_fn, optimizer, steps))
            finally:
                if tracking is not None:
                    tracking.stop()
        line = f"{name:12s} round {index + 1}: untracked {times['untracked'] * 1e3:8.3f} ms/step"
        for variant in VARIANTS[1:]:
            ratios[variant].append(times[variant] / times["untracked"])
            differences[variant].append(times[variant] - times["untracked"])
            line += f"   {variant} {times[variant] * 1e3:8.3f} ms ({ratios[variant][-1]:.3f}x)"
        print(line, flush=True)
    for variant in VARIANTS[1:]:
        values = ratios[variant]
        print(f"{name:12s} {variant:13s} median ratio to untracked over {rounds} rounds: {statistics.median(values):.3f} "
              f"(min {min(values):.3f}, max {max(values):.3f}); median difference "
              f"{statistics.median(differences[variant]) * 1e6:+.1f} us/step", flush=True)
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS) + ["all"], default="all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--trace", action="store_true", help="record the trace in both halves")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    torchmem.install("cpu")
    if args.trace:
        torchmem.record_trace()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, trace {'on' if args.trace else 'off'}")
    for name in list(MODELS) if args.model == "all" else [args.model]:
        measure(name, args.rounds, args.steps, args.warmup)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
