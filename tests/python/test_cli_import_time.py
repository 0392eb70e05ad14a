"""``torchmem run``: memory a module allocates while it is imported during the run and keeps
in its globals (a library's constants) is reported as import-time, not as the script's leak."""

from __future__ import annotations

import json

from test_cli import line_number, torchmem_cli, write

# In the shape of torchmetrics.functional.text.chrf: `_EPS_SMOOTHING = tensor(1e-16)` at import.
LIBRARY = """\
    import torch

    _EPS_SMOOTHING = torch.tensor([1e-16] * 64)  # a constant made at import


    def _table():
        return torch.zeros(128)  # made by a function the import calls


    _TABLE = _table()


    def chrf_score(x):
        return x + _EPS_SMOOTHING
"""


def make_library(tmp_path) -> str:
    package = tmp_path / "metriclib"
    package.mkdir()
    (package / "__init__.py").write_text("from metriclib.text import chrf_score\n")
    return write(package / "text.py", LIBRARY)


def test_a_librarys_import_time_constants_are_not_the_scripts_leak(tmp_path):
    make_library(tmp_path)
    script = write(tmp_path / "train.py", """\
        import torch
        import metriclib

        print(metriclib.chrf_score(torch.ones(64)).sum().item())
    """)
    result = torchmem_cli("run", "--fail-on-leak", script, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "torchmem.leak_check: no leaks" in result.stderr
    assert "held by       metriclib.text._EPS_SMOOTHING" in result.stderr
    assert ("import-time, kept by module globals: allocated while metriclib.text was imported, held for the "
            "life of the process (not a leak of the script)") in result.stderr
    assert "metriclib.text._TABLE" in result.stderr


def test_what_the_script_itself_puts_in_a_module_global_is_still_a_leak(tmp_path):
    library = make_library(tmp_path)
    script = write(tmp_path / "train.py", """\
        import torch
        import metriclib.text

        metriclib.text.CACHE = torch.ones(32)  # the script's doing
    """)
    result = torchmem_cli("run", "--json", "report.json", script, cwd=tmp_path)
    findings = json.loads((tmp_path / "report.json").read_text())["leaks"]["findings"]
    by_holder = {finding["owners"][0]["path"]: finding for finding in findings}

    assert by_holder["metriclib.text.CACHE"]["kind"] == "reachable"
    assert by_holder["metriclib.text.CACHE"]["frames"][0]["line"] == line_number(script, "the script's doing")
    assert by_holder["metriclib.text._EPS_SMOOTHING"]["kind"] == "allowed"
    assert by_holder["metriclib.text._EPS_SMOOTHING"]["frames"][0]["line"] == line_number(library, "made at import")
    assert "torchmem.leak_check: 512 B in 1 block allocated inside is still alive" in result.stderr


def test_a_lazy_import_inside_the_loop_is_recognized_too(tmp_path):
    make_library(tmp_path)
    script = write(tmp_path / "train.py", """\
        import torch

        def evaluate():
            from metriclib import chrf_score  # imported on first use, as libraries often do
            return chrf_score(torch.ones(64)).sum().item()

        for _ in range(3):
            evaluate()
    """)
    result = torchmem_cli("run", "--fail-on-leak", script, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "torchmem.leak_check: no leaks" in result.stderr
    assert "allocated while metriclib.text was imported" in result.stderr


def test_a_report_without_module_held_blocks_never_maps_the_imported_modules(monkeypatch):
    """The plugin asks after every test; a report whose findings no module state holds is
    returned as it is, without listing every imported module's file."""
    from types import SimpleNamespace

    from torchmem.integrations import import_time
    from torchmem.leaks.kinds import REACHABLE

    def no_mapping():
        raise AssertionError("mapped the imported modules for a report that cannot need it")

    monkeypatch.setattr(import_time, "_module_names", no_mapping)
    held_by_a_local = SimpleNamespace(kind=REACHABLE, owners=[SimpleNamespace(kind="local")], frames=[])
    report = SimpleNamespace(findings=[held_by_a_local])
    assert import_time.classify(report, None) is report
    assert import_time.classify(SimpleNamespace(findings=[]), None).findings == []
