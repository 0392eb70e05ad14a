"""``torchmem run`` watches the training loop: steps found without changing the script
(optimizer.step(), or --step-on module:function), memory per step judged by a GrowthMonitor,
and the exit report saying which tags and sites grew."""

from __future__ import annotations

import json

from test_cli import line_number, torchmem_cli, write

# The README's row: a list of per-step outputs in a global. At exit the global is released
# first, so the leak check sees nothing; only the steps show the growth.
KEEPS_OUTPUTS = """\
    import torch

    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for step in range(12):
        out = model(torch.randn(32, 64))
        out.sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        history.append(out.detach())  # kept every step
    print("trained")
"""

CLEAN_LOOP = """\
    import torch

    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(12):
        loss = model(torch.randn(32, 64)).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""

NO_OPTIMIZER = """\
    import torch

    kept = []

    def train_step(i):
        x = torch.randn(256)
        kept.append(x * 2)  # kept every step

    for i in range(10):
        train_step(i)
"""


def growth_section(stderr: str) -> str:
    return stderr.split("growth per training step:", 1)[1]


def test_optimizer_steps_are_found_and_the_growing_site_is_named(tmp_path):
    script = write(tmp_path / "train.py", KEEPS_OUTPUTS)
    result = torchmem_cli("run", script, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "torchmem.leak_check: no leaks" in result.stderr  # the globals were released first ...
    assert "growth per training step: 12 steps (optimizer.step() calls)" in result.stderr
    growth = growth_section(result.stderr)
    assert "live memory grew" in growth  # ... but the steps show the growth, and where
    assert f"train.py:{line_number(script, 'out = model(')}" in growth
    assert "tag=untagged" in growth


def test_a_clean_loop_shows_no_growth(tmp_path):
    script = write(tmp_path / "train.py", CLEAN_LOOP)
    result = torchmem_cli("run", "--fail-on-leak", script, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "growth per training step: 12 steps (optimizer.step() calls)" in result.stderr
    assert "no growth" in growth_section(result.stderr)


def test_fail_on_leak_fails_a_loop_that_grows(tmp_path):
    script = write(tmp_path / "train.py", KEEPS_OUTPUTS)
    result = torchmem_cli("run", "--fail-on-leak", "--json", "report.json", script, cwd=tmp_path)

    assert result.returncode == 1, result.stderr
    assert "torchmem: exit code 1: the script grew over its training steps (--fail-on-leak)" in result.stderr
    growth = json.loads((tmp_path / "report.json").read_text())["growth"]
    assert growth["steps"] == 12 and growth["step_source"] == "optimizer"
    assert growth["report"]["growing"]


def test_step_on_names_the_scripts_own_step_function(tmp_path):
    script = write(tmp_path / "loop.py", NO_OPTIMIZER)
    result = torchmem_cli("run", "--step-on", "__main__:train_step", script, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "growth per training step: 10 steps (returns of the --step-on function(s))" in result.stderr
    assert f"loop.py:{line_number(script, 'kept every step')}" in growth_section(result.stderr)


def test_without_an_optimizer_or_step_on_the_report_says_how_to_name_a_step(tmp_path):
    script = write(tmp_path / "loop.py", NO_OPTIMIZER)
    result = torchmem_cli("run", script, cwd=tmp_path)

    assert "growth per training step: no step seen (no torch.optim optimizer stepped; name the function " \
           "that ends a step with --step-on module:function)" in result.stderr


def test_step_on_a_function_of_an_imported_module(tmp_path):
    package = tmp_path / "trainlib"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write(package / "loop.py", """\
        import torch

        CACHE = []

        class Trainer:
            def training_step(self):
                CACHE.append(torch.randn(256))  # kept every step

        def fit(steps):
            trainer = Trainer()
            for _ in range(steps):
                trainer.training_step()
    """)
    script = write(tmp_path / "main.py", "from trainlib.loop import fit\nfit(10)\n")
    result = torchmem_cli("run", "--step-on", "trainlib.loop:Trainer.training_step", script, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "growth per training step: 10 steps" in result.stderr
    assert "loop.py:7" in growth_section(result.stderr)


def test_a_step_on_function_that_does_not_exist_is_reported(tmp_path):
    script = write(tmp_path / "loop.py", NO_OPTIMIZER)
    result = torchmem_cli("run", "--step-on", "__main__:train", "--step-on", "never_imported:step", script,
                          cwd=tmp_path)

    assert "torchmem: --step-on __main__:train: the script defines no top-level train" in result.stderr
    assert "torchmem: --step-on never_imported:step: module never_imported was never imported" in result.stderr


def test_a_malformed_step_on_is_a_usage_error(tmp_path):
    result = torchmem_cli("run", "--step-on", "train_step", "x.py", cwd=tmp_path)

    assert result.returncode == 2
    assert "--step-on train_step: expected module:function or module:Class.method" in result.stderr


def test_step_on_names_a_function_of_the_module_run_with_dash_m(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    script = write(package / "train.py", NO_OPTIMIZER)
    result = torchmem_cli("run", "--step-on", "pkg.train:train_step", "-m", "pkg.train", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "growth per training step: 10 steps" in result.stderr
    assert f"train.py:{line_number(script, 'kept every step')}" in growth_section(result.stderr)
