"""``torchmem run`` options for CI and scripting: --fail-on-leak (and TORCHMEM_FAIL_ON_LEAK),
-f/--force, -q/--quiet, --version; run as a user runs them, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_cli import ROOT, torchmem_cli, write

# One block held by another module's global: a leak at exit, whatever happens to the script's globals.
LEAKS = """\
    import json
    import torch
    json.torchmem_test_cache = torch.ones(1000)  # held by another module
    print("script done")
"""
CLEAN = """\
    import torch
    weights = torch.ones(1000)  # a global: released at exit, not a leak
    print("script done")
"""


def test_fail_on_leak_exits_1_with_the_report(tmp_path):
    script = write(tmp_path / "leaks.py", LEAKS)
    result = torchmem_cli("run", "--fail-on-leak", script, cwd=tmp_path)

    assert result.returncode == 1, result.stderr
    assert "script done" in result.stdout
    assert "held by       json.torchmem_test_cache" in result.stderr  # the report is there ...
    assert "torchmem: exit code 1: the script leaked 4.0 KiB in 1 block (--fail-on-leak)" in result.stderr


def test_without_fail_on_leak_a_leak_keeps_the_scripts_exit_code(tmp_path):
    script = write(tmp_path / "leaks.py", LEAKS)
    result = torchmem_cli("run", script, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "held by       json.torchmem_test_cache" in result.stderr


def test_fail_on_leak_passes_a_clean_script(tmp_path):
    script = write(tmp_path / "clean.py", CLEAN)
    result = torchmem_cli("run", "--fail-on-leak", script, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "torchmem.leak_check: no leaks" in result.stderr


def test_fail_on_leak_keeps_a_failing_scripts_own_exit_code(tmp_path):
    script = write(tmp_path / "leaks.py", LEAKS + "    raise SystemExit(3)\n")
    result = torchmem_cli("run", "--fail-on-leak", script, cwd=tmp_path)

    assert result.returncode == 3, result.stderr


@pytest.mark.parametrize("value, code", [("1", 1), ("yes", 1), ("0", 0)])
def test_the_environment_variable_turns_fail_on_leak_on(tmp_path, monkeypatch, value, code):
    monkeypatch.setenv("TORCHMEM_FAIL_ON_LEAK", value)
    script = write(tmp_path / "leaks.py", LEAKS)
    result = torchmem_cli("run", script, cwd=tmp_path)

    assert result.returncode == code, result.stderr


def test_a_bad_environment_value_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHMEM_FAIL_ON_LEAK", "sometimes")
    script = write(tmp_path / "marker.py", "open('ran', 'w').close()\n")
    result = torchmem_cli("run", script, cwd=tmp_path)

    assert result.returncode == 2
    assert "TORCHMEM_FAIL_ON_LEAK='sometimes': use 1 or 0" in result.stderr
    assert not (tmp_path / "ran").exists()


def test_fail_on_leak_without_the_leak_report_is_refused(tmp_path):
    result = torchmem_cli("run", "--fail-on-leak", "--no-leak-report", "x.py", cwd=tmp_path)

    assert result.returncode == 2
    assert "--fail-on-leak needs the leak report" in result.stderr


@pytest.mark.parametrize("option", ["--json", "--snapshot"])
def test_an_existing_output_file_is_not_overwritten_without_force(tmp_path, option):
    (tmp_path / "out").write_text("an earlier run's report")
    script = write(tmp_path / "marker.py", "open('ran', 'w').close()\n")
    result = torchmem_cli("run", option, "out", script, cwd=tmp_path)

    assert result.returncode == 2
    assert f"{option} out: the file exists; pass -f/--force to overwrite it" in result.stderr
    assert (tmp_path / "out").read_text() == "an earlier run's report"
    assert not (tmp_path / "ran").exists()  # refused before the script ran


def test_force_overwrites_an_existing_json_report(tmp_path):
    (tmp_path / "report.json").write_text("an earlier run's report")
    script = write(tmp_path / "clean.py", CLEAN)
    result = torchmem_cli("run", "-f", "--json", "report.json", script, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "report.json").read_text())["exit_code"] == 0


def test_quiet_prints_nothing_for_a_clean_script(tmp_path):
    script = write(tmp_path / "clean.py", CLEAN)
    result = torchmem_cli("run", "-q", script, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "script done\n"
    assert result.stderr == ""


def test_quiet_still_prints_the_leaks(tmp_path):
    script = write(tmp_path / "leaks.py", LEAKS)
    result = torchmem_cli("run", "-q", script, cwd=tmp_path)

    assert "held by       json.torchmem_test_cache" in result.stderr
    assert "torchmem summary" not in result.stderr


def test_version_prints_the_installed_version():
    import torchmem

    result = subprocess.run([sys.executable, "-m", "torchmem", "--version"], env=dict(os.environ, PYTHONPATH=ROOT),
                            capture_output=True, text=True)

    assert result.returncode == 0
    assert result.stdout.strip() == f"python -m torchmem {torchmem.__version__}"


def test_the_torchmem_console_script_is_declared():
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
        scripts = tomllib.load(file)["project"]["scripts"]
    module, function = scripts["torchmem"].split(":")
    command = f"import sys, {module} as m; sys.argv = ['torchmem', '--version']; m.{function}()"
    result = subprocess.run([sys.executable, "-c", command], env=dict(os.environ, PYTHONPATH=ROOT),
                            capture_output=True, text=True)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("torchmem ")
