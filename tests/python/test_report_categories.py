"""Categories (torchmem.track): what a tracked forward saves for backward counts as
activations, but a parameter saved for backward (a Linear saves its weight's transpose) is
not memory kept alive by backward, tracked model's or not."""

from __future__ import annotations

import torch

import torchmem
from torchmem.reports import categories as _categories

SHARED = torch.nn.Linear(256, 256)  # a module the tracked model uses but nobody tracks


class UsesAnUntrackedLayer(torch.nn.Module):
    def forward(self, x):
        return SHARED(x * 2)


def test_a_parameter_saved_for_backward_is_not_an_activation():
    torchmem.install("cpu")
    model = UsesAnUntrackedLayer()
    tracking = torchmem.track(model)
    try:
        x = torch.randn(16, 256, requires_grad=True)  # so that the Linear saves its weight for x.grad
        out = model(x).sum()
        categories = torchmem.summary(format="dict")["devices"]["cpu"]["categories"]
        # Saved for backward: x * 2 (the Linear's input, 16 KiB); its weight's transpose too, but
        # that is SHARED.weight's memory, alive whether saved or not.
        assert categories["activations"] == 16 * 256 * 4
        out.backward()
        assert torchmem.summary(format="dict")["devices"]["cpu"]["categories"]["activations"] == 0
    finally:
        tracking.stop()
        assert not _categories.is_tracking()


def test_modules_false_hooks_the_model_only_and_still_counts_activations():
    torchmem.install("cpu")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    x = torch.randn(32, 64, requires_grad=True)
    per_module = torchmem.track(model)
    try:
        hooked = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
        out = model(x).sum()
        expected = torchmem.summary(format="dict")["devices"]["cpu"]["categories"]["activations"]
        modules = {m["module"] for m in torchmem.summary(format="dict")["devices"]["cpu"]["top_modules"]
                   if m["categories"].get("activations")}
        del out
    finally:
        per_module.stop()
    # Linear 0 saves x; ReLU saves its output (which Linear 2 saves too: one storage, counted once).
    assert hooked == 2 * 4 and modules == {"Sequential.0", "Sequential.1"}

    model_only = torchmem.track(model, modules=False)
    try:
        assert sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules()) == 2
        out = model(x).sum()
        figures = torchmem.summary(format="dict")["devices"]["cpu"]
        assert figures["categories"]["activations"] == expected > 0
        assert {m["module"] for m in figures["top_modules"] if m["categories"].get("activations")} == {"Sequential"}
        del out
    finally:
        model_only.stop()
