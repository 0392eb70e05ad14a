"""``torchmem demo``: the Composer metrics leak, caught and named (:mod:`torchmem.integrations.demo`)."""

from __future__ import annotations

import argparse

from torchmem._support.validate import argparse_int
from torchmem.integrations.cli.common import UsageError
from torchmem.integrations.devices import DEVICE_CHOICES, NoCudaError

NAME = "demo"
HELP = "a training loop with the Composer metrics leak, and the report that names it"


def add_parser(commands, prog: str) -> argparse.ArgumentParser:
    demo = commands.add_parser(
        NAME,
        help=HELP,
        description=(
            "Trains a tiny model whose loop deep-copies a torchmetrics Metric on every batch (the "
            "bug in mosaicml/composer#3153), shows torchmem's leak and growth reports naming it, then "
            "shows the fixed loop is clean. Takes a few seconds on CPU."
        ),
    )
    demo.add_argument(
        "--device",
        choices=DEVICE_CHOICES,
        default="auto",
        help="auto = CPU tensors, and CUDA tensors too when a device is available (default)",
    )
    demo.add_argument(
        "--steps",
        type=argparse_int(minimum=None),  # the range is the demo's own (demo.MIN_STEPS, MAX_STEPS)
        default=10,
        help="training steps per loop (default 10; 3 to 100)",
    )
    return demo


def execute(args: argparse.Namespace, prog: str) -> int:
    from torchmem.integrations import demo

    try:
        demo.check_steps(args.steps)
    except (TypeError, ValueError) as error:
        raise UsageError(str(error)) from None
    try:
        return demo.main(device=args.device, steps=args.steps)
    except NoCudaError as error:
        raise UsageError(str(error)) from None
