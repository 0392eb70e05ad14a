"""``python -m torchmem run`` and ``python -m torchmem demo``, run as a user runs them: in a subprocess."""

from __future__ import annotations

import json
import os
import re
import pickle
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def torchmem_cli(*args: str, cwd, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-m", "torchmem", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def write(path, source: str) -> str:
    path.write_text(textwrap.dedent(source))
    return str(path)


def line_number(path, text: str) -> int:
    return next(i for i, line in enumerate(open(path), start=1) if text in line)


# --- a typical script -----------------------------------------------------------------------------

TYPICAL = """\
    import atexit, json, sys
    import torch
    import torchmem

    model = torch.nn.Linear(256, 256)  # held by a global: released at exit, not a leak
    with torchmem.tag("train"):
        activations = model(torch.randn(64, 256))
        activations.sum().backward()
    atexit.register(lambda: print("script atexit sees", type(model).__name__))
    with open(sys.argv[1], "w") as out:
        json.dump({"argv": sys.argv, "name": __name__, "file": __file__}, out)
    print("script done")
"""


@pytest.fixture(scope="module")
def typical(tmp_path_factory):
    """One run of a plain script with --snapshot and --json; several tests read it."""
    tmp = tmp_path_factory.mktemp("typical")
    script = write(tmp / "train.py", TYPICAL)
    result = torchmem_cli(
        "run", "--snapshot", "mem.pickle", "--json", "report.json", script, str(tmp / "seen.json"), "--lr", "3",
        cwd=tmp,
    )
    return tmp, script, result


def test_run_executes_the_script_as_main_with_its_own_arguments(typical):
    tmp, script, result = typical
    seen = json.loads((tmp / "seen.json").read_text())

    assert result.returncode == 0, result.stderr
    assert "script done" in result.stdout
    assert seen["name"] == "__main__"
    assert seen["argv"] == [script, str(tmp / "seen.json"), "--lr", "3"]  # options after the script are its own
    assert seen["file"] == os.path.abspath(script)


def test_run_prints_the_summary_at_exit_on_stderr(typical):
    _, _, result = typical

    assert "torchmem: " in result.stderr and "exited with code 0" in result.stderr
    assert "torchmem summary: cpu" in result.stderr
    assert "  train " in result.stderr  # the tag the script used
    assert "fragmentation of the cache" in result.stderr
    assert "torchmem summary" not in result.stdout  # the script's stdout stays the script's


def test_the_scripts_atexit_functions_run_before_its_globals_are_released(typical):
    _, _, result = typical

    # Had torchmem released the globals first, the lambda would see None ("NoneType").
    assert "script atexit sees Linear" in result.stdout


def test_globals_of_the_script_are_not_reported_as_leaks(typical):
    _, _, result = typical

    assert "torchmem.leak_check: no leaks" in result.stderr
    assert "leaks at exit" in result.stderr


def test_snapshot_option_writes_a_snapshot_memory_viz_accepts(typical):
    tmp, script, result = typical
    snapshot = pickle.loads((tmp / "mem.pickle").read_bytes())
    viz = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", "mem.pickle", "-o", "mem.html"],
        cwd=tmp, capture_output=True, text=True, timeout=300,
    )
    stats = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "stats", "mem.pickle"],
        cwd=tmp, capture_output=True, text=True, timeout=300,
    )

    assert f"snapshot written to {tmp / 'mem.pickle'}" in result.stderr
    assert viz.returncode == 0 and "add_local_files" in (tmp / "mem.html").read_text()
    assert stats.returncode == 0 and "total_reserved" in stats.stdout
    (trace,) = snapshot["device_traces"]
    allocs = [entry for entry in trace if entry["action"] == "alloc" and entry["frames"]]
    assert allocs, "--snapshot records the allocation history"
    # The runner's own frames are trimmed: the script's <module> frame is the outermost.
    model_line = line_number(script, "torch.nn.Linear(256, 256)")
    stacks = [entry["frames"] for entry in allocs]
    assert any(frames[-1] == {"filename": script, "line": model_line, "name": "<module>"} for frames in stacks)
    assert not any("torchmem/integrations" in frame["filename"] for frames in stacks for frame in frames)


def test_json_option_writes_the_summary_and_the_leak_findings(typical):
    tmp, script, result = typical
    report = json.loads((tmp / "report.json").read_text())

    assert report["exit_code"] == 0
    assert report["target"] == {"script": script, "module": None, "args": [str(tmp / "seen.json"), "--lr", "3"]}
    assert report["devices"] == ["cpu"]
    assert report["summary"]["devices"]["cpu"]["allocated"]["peak"] > 0
    assert "train" in {tag["tag"] for tag in report["summary"]["devices"]["cpu"]["tags"]}
    assert report["leaks"]["totals"]["cycle"]["blocks"] == 0
    assert report["released_with_globals_bytes"] > 256 * 256 * 4  # the model's weight at least
    assert report["snapshot"] == str(tmp / "mem.pickle")


# --- leaks ---------------------------------------------------------------------------------------

LEAKY = """\
    import gc, json
    import torch

    gc.disable()  # as in a long run: the cycle's garbage waits for a rare full collection

    class Holder:
        def __init__(self):
            self.me = self
            self.state = torch.zeros(100_000)  # cycle-held

    for _ in range(3):
        holder = Holder()
    del holder
    json.torchmem_test_cache = torch.ones(1000)  # held by another module
"""


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("leaky")
    script = write(tmp / "leaky.py", LEAKY)
    return tmp, script, torchmem_cli("run", "--json", "report.json", script, cwd=tmp)


def test_memory_held_by_reference_cycles_is_reported_with_its_allocation_line(leaky):
    tmp, script, result = leaky

    assert result.returncode == 0, result.stderr
    assert "cycle" in result.stderr and "reference cycle: freed only by gc" in result.stderr
    assert "Holder.me is the same Holder" in result.stderr
    assert f"leaky.py:{line_number(script, 'cycle-held')}" in result.stderr


def test_memory_held_by_another_modules_global_is_reported_with_its_holder(leaky):
    _, script, result = leaky

    assert "reachable" in result.stderr
    assert "held by       json.torchmem_test_cache" in result.stderr
    assert f"leaky.py:{line_number(script, 'held by another module')}" in result.stderr


def test_leak_findings_are_in_the_json_report(leaky):
    tmp, _, _ = leaky
    totals = json.loads((tmp / "report.json").read_text())["leaks"]["totals"]

    assert totals["cycle"]["blocks"] == 3
    assert totals["reachable"]["blocks"] == 1


def test_no_leak_report_skips_the_leak_check(tmp_path):
    script = write(tmp_path / "leaky.py", LEAKY)
    result = torchmem_cli("run", "--no-leak-report", script, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "torchmem summary: cpu" in result.stderr
    assert "leaks at exit" not in result.stderr and "leak_check" not in result.stderr


# --- exit codes ----------------------------------------------------------------------------------


def test_sys_exit_code_is_preserved_and_the_report_still_printed(tmp_path):
    script = write(tmp_path / "exit3.py", "import sys, torch\nx = torch.ones(10)\nsys.exit(3)\n")
    result = torchmem_cli("run", script, cwd=tmp_path)

    assert result.returncode == 3
    assert "exited with code 3" in result.stderr and "torchmem summary: cpu" in result.stderr


def test_an_uncaught_exception_prints_the_scripts_traceback_and_exits_1(tmp_path):
    script = write(tmp_path / "boom.py", "import torch\n\ndef fail():\n    raise ValueError('boom')\n\nfail()\n")
    result = torchmem_cli("run", script, cwd=tmp_path)

    assert result.returncode == 1
    assert "Traceback (most recent call last):" in result.stderr
    assert f'File "{script}", line 6, in <module>' in result.stderr
    assert f'File "{script}", line 4, in fail' in result.stderr
    assert "ValueError: boom" in result.stderr
    assert "torchmem/integrations" not in result.stderr  # torchmem's runner is not part of the script's traceback
    assert "exited with code 1" in result.stderr


def test_sys_exit_with_a_message_prints_it_and_exits_1(tmp_path):
    script = write(tmp_path / "message.py", "import sys\nsys.exit('cannot continue')\n")
    result = torchmem_cli("run", "--no-leak-report", script, cwd=tmp_path)

    assert result.returncode == 1
    assert "cannot continue" in result.stderr


def test_a_syntax_error_is_reported_like_python_does(tmp_path):
    script = write(tmp_path / "broken.py", "x = (\n")
    result = torchmem_cli("run", script, cwd=tmp_path)

    assert result.returncode == 1
    assert "SyntaxError" in result.stderr


# --- modules --------------------------------------------------------------------------------------


def test_run_dash_m_runs_a_module_as_main_with_its_arguments(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write(package / "job.py", """\
        import json, sys
        import torch
        weights = torch.ones(100)
        json.dump({"argv": sys.argv[1:], "name": __name__, "package": __package__}, open("seen.json", "w"))
        sys.exit(4)
    """)
    result = torchmem_cli("run", "-m", "mypkg.job", "--epochs", "2", cwd=tmp_path)
    seen = json.loads((tmp_path / "seen.json").read_text())

    assert result.returncode == 4, result.stderr
    assert seen == {"argv": ["--epochs", "2"], "name": "__main__", "package": "mypkg"}
    assert "torchmem: -m mypkg.job exited with code 4" in result.stderr


def test_run_dash_m_runs_a_packages_main_module(tmp_path):
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write(package / "__main__.py", """\
        import sys
        print("package main ran as", __name__, __spec__.name, sys.argv[1:])
    """)
    result = torchmem_cli("run", "-m", "trainer", "--fast", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "package main ran as __main__ trainer.__main__ ['--fast']" in result.stdout


def test_run_dash_m_on_a_package_without_main_says_so_as_python_does(tmp_path):
    package = tmp_path / "library"
    package.mkdir()
    (package / "__init__.py").write_text("")
    result = torchmem_cli("run", "-m", "library", cwd=tmp_path)

    assert result.returncode == 1
    assert "No module named library.__main__; 'library' is a package and cannot be directly executed" in result.stderr


# --- bad input -----------------------------------------------------------------------------------


def test_a_script_that_does_not_exist_is_a_clear_error(tmp_path):
    result = torchmem_cli("run", "no_such_script.py", cwd=tmp_path)

    assert result.returncode == 2
    assert "can't open file 'no_such_script.py'" in result.stderr
    assert "torchmem summary" not in result.stderr


def test_a_module_that_does_not_exist_is_reported_as_python_does(tmp_path):
    result = torchmem_cli("run", "-m", "no_such_module_xyz", cwd=tmp_path)

    assert result.returncode == 1
    assert "No module named no_such_module_xyz" in result.stderr


def test_an_unwritable_snapshot_path_fails_before_the_script_runs(tmp_path):
    script = write(tmp_path / "marker.py", "open('ran', 'w').close()\n")
    result = torchmem_cli("run", "--snapshot", str(tmp_path / "missing" / "mem.pickle"), script, cwd=tmp_path)

    assert result.returncode == 2
    assert "--snapshot" in result.stderr and "does not exist" in result.stderr
    assert not (tmp_path / "ran").exists()


def test_a_json_path_that_is_a_directory_fails_before_the_script_runs(tmp_path):
    script = write(tmp_path / "marker.py", "open('ran', 'w').close()\n")
    result = torchmem_cli("run", "--json", str(tmp_path), script, cwd=tmp_path)

    assert result.returncode == 2
    assert "--json" in result.stderr and "is a directory" in result.stderr
    assert not (tmp_path / "ran").exists()


def test_run_without_a_script_explains_what_to_give(tmp_path):
    result = torchmem_cli("run", cwd=tmp_path)

    assert result.returncode == 2
    assert "name a script to run" in result.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--history-entries", "-1", "--snapshot", "m.pickle", "x.py"],
         "argument --history-entries: must be an int >= 0, got -1"),
        (["run", "--history-entries", "many", "x.py"], "argument --history-entries: must be an int >= 0, got 'many'"),
        (["run", "--dist-timeout", "0", "x.py"], "argument --dist-timeout: must be seconds > 0, got 0.0"),
        (["run", "--dist-timeout", "nan", "x.py"], "argument --dist-timeout: must be seconds > 0, got nan"),
        (["demo", "--steps", "two"], "argument --steps: must be an int, got 'two'"),
    ],
)
def test_numeric_options_are_refused_with_the_range_they_take(tmp_path, argv, message):
    result = torchmem_cli(*argv, cwd=tmp_path)

    assert result.returncode == 2
    assert message in result.stderr


def test_the_demo_module_does_not_import_the_command_line():
    # The demo is a library of the CLI, not the other way round: no import circle.
    code = "import sys, torchmem.integrations.demo; print(sorted(m for m in sys.modules if m.startswith('torchmem.integrations.cli')))"
    result = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=ROOT),
                            capture_output=True, text=True)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_an_unknown_device_choice_is_refused(tmp_path):
    result = torchmem_cli("run", "--device", "tpu", "x.py", cwd=tmp_path)

    assert result.returncode == 2
    assert "invalid choice: 'tpu'" in result.stderr


def test_device_cuda_needs_a_cuda_device(tmp_path):
    import torch

    script = write(tmp_path / "noop.py", "pass\n")
    result = torchmem_cli("run", "--device", "cuda", "--no-leak-report", script, cwd=tmp_path)

    if torch.cuda.is_available():
        assert result.returncode == 0 and "torchmem summary: cuda:0" in result.stderr
    else:
        assert result.returncode == 2
        assert "--device cuda: no CUDA device is available" in result.stderr


# --- the demo ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return torchmem_cli("demo", "--device", "cpu", "--steps", "8", cwd=tmp_path_factory.mktemp("demo"))


def test_the_demo_finds_the_composer_leak_as_cycle_held_metric_copies(demo):
    assert demo.returncode == 0, demo.stderr
    buggy = demo.stdout.split("2) the fixed loop")[0]
    assert "copy.deepcopy(metrics)" in buggy
    # The 8 copies' state (confmat and its default, 2 MiB each), freed only by gc, counted
    # because the deepcopy line left a new cycle every step; what 7 of them computed (the
    # last result is kept, declared with expect_alive) is reported, under the default 8.
    assert "cycle 32.0 MiB in 16 blocks" in buggy
    assert "cycle garbage not counted 14.0 MiB in 7 blocks" in buggy
    assert re.search(r"allocated at  \S*demo\.py:\d+  metrics = copy\.deepcopy\(metrics\)  # the bug", buggy)
    assert "counted: 8 separate cycles held by MulticlassConfusionMatrix" in buggy
    assert "(reference cycle: freed only by gc)" in buggy
    assert "is the same MulticlassConfusionMatrix" in buggy
    assert "tag=metrics" in buggy


def test_the_demo_shows_growth_per_step_in_the_buggy_loop(demo):
    buggy = demo.stdout.split("2) the fixed loop")[0]

    assert "live memory grew on every one of the 7 steps after 1 warm-up step(s)" in buggy
    assert "+2.0 MiB/step" in buggy


def test_the_demo_shows_the_fixed_loop_is_clean(demo):
    fixed = demo.stdout.split("2) the fixed loop")[1]

    assert "torchmem.leak_check: no leaks" in fixed
    assert "torchmem.GrowthMonitor: no growth" in fixed


def test_the_demo_refuses_too_few_steps(tmp_path):
    result = torchmem_cli("demo", "--steps", "1", cwd=tmp_path)

    assert result.returncode == 2
    assert "demo: steps must be an int between 3 and 100" in result.stderr
