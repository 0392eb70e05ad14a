"""What ``torchmem.track(model, optimizer)`` costs a training step: the same step timed with
and without tracking, alternating in one process, on CPU tensors served by torchmem.

    python benchmarks/track_cost.py                       # every model, 5 rounds of 30 steps
    python benchmarks/track_cost.py --model transformer --rounds 7 --steps 50 --threads 1
    python benchmarks/track_cost.py --model lightning --show-categories   # what track() sees

Models: ``tiny`` (4 Linear layers 64 wide, batch 8: a step that is mostly Python, the
worst case for tracking's hooks), ``deep`` (32 Linear layers 16 wide: the cost per
tracked module), ``mlp`` (4 Linear layers, 1024 wide, batch 256) and ``transformer``
(``torch.nn.TransformerEncoder``, PyTorch's own layers: 4 layers, d_model 256, 4 heads,
batch 16 x 128 tokens), ``lightning`` (``lightning.pytorch.demos.Transformer``, Lightning's demo
language model: 2 encoder and 2 decoder layers, d_model 128, vocabulary 2,000, batch 8 x 64
tokens; needs the ``lightning`` package), each with Adam. A round times ``--steps`` steps untracked, then
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


def _lightning():
    # A model nobody at torchmem wrote: Lightning's demo language model (an nn.Transformer
    # encoder-decoder with embeddings), trained as its demo trains it (NLL on next tokens).
    from lightning.pytorch.demos import Transformer

    torch.manual_seed(0)
    model = Transformer(vocab_size=2000, ninp=128, nhead=4, nhid=256, nlayers=2, dropout=0.0)
    tokens = torch.randint(0, 2000, (8, 64))
    target = torch.randint(0, 2000, (8, 64))
    return model, lambda: torch.nn.functional.nll_loss(model(tokens, target), target.view(-1))


MODELS = {"tiny": _tiny, "deep": _deep, "mlp": _mlp, "transformer": _transformer, "lightning": _lightning}
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


def show_categories(name: str) -> None:
    """What ``track`` sees in one training step of ``name``: the categories at the end of the
    second forward (optimizer state exists by then) and after the step, and the modules
    holding the most activations."""
    model, loss_fn = MODELS[name]()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    tracking = torchmem.track(model, optimizer)

    def mib(categories: dict) -> str:
        return ", ".join(f"{key} {value / 2**20:.2f} MiB" for key, value in categories.items())

    try:
        for step in range(2):
            loss = loss_fn()
            if step == 1:
                figures = torchmem.summary(format="dict")["devices"]["cpu"]
                print(f"{name}: at the end of the forward: {mib(figures['categories'])}")
                holders = sorted(figures["top_modules"], key=lambda m: -m["categories"].get("activations", 0))
                for module in holders[:4]:
                    print(f"  {module['module']}: activations {module['categories'].get('activations', 0) / 2**20:.2f} MiB")
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            del loss
        figures = torchmem.summary(format="dict")["devices"]["cpu"]
        print(f"{name}: after backward and the step: {mib(figures['categories'])}")
        print(f"{name}: notes: {tracking.notes or 'none'}")
    finally:
        tracking.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS) + ["all"], default="all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--trace", action="store_true", help="record the trace in both halves")
    parser.add_argument("--show-categories", action="store_true",
                        help="instead of timing: print what track() sees in one training step")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    torchmem.install("cpu")
    if args.trace:
        torchmem.record_trace()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, trace {'on' if args.trace else 'off'}")
    for name in list(MODELS) if args.model == "all" else [args.model]:
        if args.show_categories:
            show_categories(name)
        else:
            measure(name, args.rounds, args.steps, args.warmup)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
