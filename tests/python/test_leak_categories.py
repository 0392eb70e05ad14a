"""Categories in leak reports: while ``torchmem.track(model, optimizer)`` names a model and
its optimizer, each leak finding says what the leaked memory is (parameters, gradients,
optimizer state, activations, other) and the module it belongs to, in the text a user
reads, in the JSON and in the HTML report's leak section."""

from __future__ import annotations

import pytest
import torch

import torchmem
from torchmem.reports import categories as _categories
from torchmem.reports import html as _html


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)  # weight 32 KiB, bias 512 B
        self.fc2 = torch.nn.Linear(128, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture
def tracked():
    torchmem.install("cpu")
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters())
    tracking = torchmem.track(model, optimizer)
    try:
        yield model, optimizer
    finally:
        tracking.stop()
        assert not _categories.is_tracking()


def _first_lines(text: str) -> list[str]:
    """The first line of each group of findings in a rendered report."""
    return [group.splitlines()[0] for group in text.split("\n\n")[1:]]


def test_a_kept_gradient_reads_as_gradients_and_a_kept_copy_as_other(tracked):
    model, _ = tracked
    kept = []
    with torchmem.leak_check(raise_on_leak=False) as report:
        for _ in range(3):
            model(torch.randn(32, 64)).sum().backward()  # gradients accumulate in one storage
            kept.append(model.fc1.weight.grad.clone())
    text = report.render()
    # The gradients themselves (fc1's weight and bias, allocated by the first backward) are
    # the model's gradients; the copies kept every step are just memory the loop holds.
    assert _first_lines(text) == [
        "  96.0 KiB in 3 blocks  reachable  cpu  tag=untagged  category=other",
        "  32.5 KiB in 2 blocks  reachable  cpu  tag=untagged  category=gradients (Net.fc1)",
        "  4.5 KiB in 2 blocks  reachable  cpu  tag=untagged  category=gradients (Net.fc2)",
    ], text
    assert "kept.append(model.fc1.weight.grad.clone())" in text.split("\n\n")[1]
    copies = [f for f in report.leaked if f.category == "other"]
    assert len(copies) == 3 and all(f.module is None for f in copies)
    as_json = report.to_dict()["findings"]
    assert {(f["category"], f["module"]) for f in as_json} >= {("gradients", "Net.fc1"), ("other", None)}


def test_optimizer_state_created_inside_the_check_reads_as_optimizer_state(tracked):
    model, optimizer = tracked
    with torchmem.leak_check(raise_on_leak=False) as report:
        model(torch.randn(32, 64)).sum().backward()
        optimizer.step()  # Adam's first step creates step, exp_avg and exp_avg_sq per parameter
    text = report.render()
    first_lines = _first_lines(text)
    assert "  66.0 KiB in 6 blocks  reachable  cpu  tag=untagged  category=optimizer_state (Net.fc1)" in first_lines, text
    assert "  10.0 KiB in 6 blocks  reachable  cpu  tag=untagged  category=optimizer_state (Net.fc2)" in first_lines, text


def test_a_kept_output_keeps_its_activations_and_says_so(tracked):
    model, _ = tracked
    outputs = []
    with torchmem.leak_check(raise_on_leak=False) as report:
        for _ in range(2):
            outputs.append(model(torch.randn(32, 64)))  # the graph stays, and what it saved
    # fc1 saved its input; torch.relu (a function, run in Net's own forward) saved its output,
    # which fc2 saved too: one storage, counted once, under the module that saved it first.
    assert _first_lines(report.render()) == [
        "  32.0 KiB in 2 blocks  reachable  cpu  tag=untagged  category=activations (Net)",
        "  16.0 KiB in 2 blocks  reachable  cpu  tag=untagged  category=activations (Net.fc1)",
        "  2.0 KiB in 2 blocks  reachable  cpu  tag=untagged  category=other",
    ], report.render()


def test_without_tracking_findings_have_no_category():
    torchmem.install("cpu")
    kept = []
    with torchmem.leak_check(raise_on_leak=False) as report:
        kept.append(torch.ones(1024))
    assert report.has_leaks
    assert "category=" not in report.render()
    assert all(f.category is None and f.module is None for f in report.findings)


def test_the_html_report_shows_the_category_of_each_leak(tracked, tmp_path):
    model, _ = tracked
    with torchmem.leak_check(raise_on_leak=False) as report:
        model(torch.randn(32, 64)).sum().backward()
    page = (tmp_path / "report.html")
    _html.write_html(page, leaks=report)
    content = page.read_text()
    assert "category=<b>gradients</b> (Net.fc1)" in content
    assert "category=<b>gradients</b> (Net.fc2)" in content
