"""The owner search decided from the roots alone (``torchmem.leaks.owners.closed``).

A unittest-style test keeps tensors on ``self`` until its exit; the search may then skip its
pass over the heap, but only when nothing outside the walk from the roots can hold them. Each
situation runs under the pytest plugin twice, with that shortcut and without it: the same
outcomes and reports, and the shortcut taken only where it is sound.
"""

from __future__ import annotations

import json
import os

import pytest

# Imported here, not first inside an in-process pytester run (see test_pytest_plugin).
import torchmem  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Records, per test, whether each owner search listed the heap, and can turn the shortcut off.
CONFTEST = """
import json, os
import torchmem.leaks.owners.search as search

search._use_closed_roots = os.environ["CLOSED_ROOTS"] == "1"
SEEN = []
OUTCOME = {}

# Recorded as each result is made: a wrapper around find_owners would be a live frame whose
# locals (the allowed roots) the search itself walks.
_OwnerSearch = search.OwnerSearch

def _recording(*args, **kwargs):
    result = _OwnerSearch(*args, **kwargs)
    SEEN.append(result.heap_listed)
    return result

search.OwnerSearch = _recording

def pytest_runtest_logstart(nodeid, location):
    SEEN.clear()
    OUTCOME.clear()

def pytest_runtest_logreport(report):
    # The check may end in the call or in the teardown phase: every phase counts.
    if report.failed:
        OUTCOME["failed"] = OUTCOME.get("failed", "") + str(report.longrepr)

def pytest_runtest_logfinish(nodeid, location):
    with open(os.environ["SEARCH_LOG"], "a") as log:
        outcome = "failed" if "failed" in OUTCOME else "passed"
        log.write(json.dumps([nodeid.split("::")[-1], outcome, list(SEEN), OUTCOME.get("failed", "")]) + "\\n")
"""

SITUATIONS = """
import ctypes
import unittest

import torch

KEPT = []
VIEWS = []
HOLDERS = []


class Situations(unittest.TestCase):
    # Tensors made in the test itself (the check covers its call) and kept on ``self``.
    def setUp(self):
        self.state = {}

    def _keep(self):
        self.weights = torch.ones(256)
        self.state["buffer"] = torch.zeros(512)
        self.state["views"] = [self.weights[:10]]

    def test_kept_on_self_only(self):
        self._keep()

    def test_also_in_a_module_list(self):
        self._keep()
        KEPT.append(self.weights)

    def test_a_view_of_its_storage_in_a_global(self):
        self._keep()
        VIEWS.append(self.state["buffer"][100:200])

    def test_its_holder_also_in_a_global(self):
        self._keep()
        HOLDERS.append(self.state)

    def test_held_from_c_as_well(self):
        self._keep()
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self.weights))

    def test_leaks_into_a_global_only(self):
        self._keep()
        KEPT.append(torch.ones(64))
"""


def _run(pytester, monkeypatch, closed: bool) -> dict:
    log = pytester.path / f"search-{int(closed)}.jsonl"
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("CLOSED_ROOTS", "1" if closed else "0")
    monkeypatch.setenv("SEARCH_LOG", str(log))
    pytester.runpytest_subprocess("-p", "torchmem.integrations.pytest_plugin", "-p", "no:cacheprovider",
                                  "--torchmem", "-p", "no:randomly")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return {name: (outcome, searches, text) for name, outcome, searches, text in rows}




def test_tensors_kept_on_self_are_allowed_without_listing_the_heap_and_leaks_still_fail(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_situations=SITUATIONS)
    fast = _run(pytester, monkeypatch, closed=True)
    full = _run(pytester, monkeypatch, closed=False)
    assert set(fast) == set(full) == {
        "test_kept_on_self_only", "test_also_in_a_module_list", "test_a_view_of_its_storage_in_a_global",
        "test_its_holder_also_in_a_global", "test_held_from_c_as_well", "test_leaks_into_a_global_only",
    }
    # The same verdicts and the same reports, with the shortcut and without it.
    for name in fast:
        assert (fast[name][0], fast[name][2]) == (full[name][0], full[name][2]), name
    assert fast["test_kept_on_self_only"][0] == "passed"
    assert fast["test_leaks_into_a_global_only"][0] == "failed"
    assert "test_situations.KEPT[" in fast["test_leaks_into_a_global_only"][2]
    # Held through the test's instance and also by a module global: a leak, naming the global.
    for name, holder in (("test_also_in_a_module_list", "test_situations.KEPT["),
                         ("test_a_view_of_its_storage_in_a_global", "test_situations.VIEWS["),
                         ("test_its_holder_also_in_a_global", "test_situations.HOLDERS[")):
        assert fast[name][0] == "failed", name
        assert holder in fast[name][2], (name, fast[name][2])
    # A reference from C names no holder: what step 1 found through the instance stands.
    assert fast["test_held_from_c_as_well"][0] == "passed"
    assert fast["test_kept_on_self_only"][1] and not any(fast["test_kept_on_self_only"][1])  # no heap listed
    assert all(full["test_kept_on_self_only"][1])  # the full search, when turned off
    for name in ("test_also_in_a_module_list", "test_a_view_of_its_storage_in_a_global",
                 "test_its_holder_also_in_a_global", "test_held_from_c_as_well", "test_leaks_into_a_global_only"):
        assert fast[name][1][-1], name  # never decided without the heap


class _Instance:
    pass


_ELSEWHERE = []


def _search_both_ways(blocks, roots):
    from torchmem.leaks.owners import search

    fast = search.find_owners(blocks, allowed_roots=roots)
    search._use_closed_roots = False
    try:
        full = search.find_owners(blocks, allowed_roots=roots)
    finally:
        search._use_closed_roots = True
    return fast, full


def test_the_search_from_closed_roots_reports_what_the_full_search_reports():
    import torch

    from torchmem.leaks.owners import AllowedRoot

    instance = _Instance()
    instance.weights = torch.ones(256)
    instance.state = {"buffer": torch.zeros(512), "views": [instance.weights[:10], instance.weights[5:]]}
    blocks = [("cpu", instance.weights.untyped_storage().data_ptr(), 1024),
              ("cpu", instance.state["buffer"].untyped_storage().data_ptr(), 2048)]
    roots = [AllowedRoot("self", instance, "the test instance")]
    fast, full = _search_both_ways(blocks, roots)
    assert not fast.heap_listed and full.heap_listed
    for field in ("owners", "allowed", "notes", "unnamed", "held_outside", "live_rooted", "stopped_early"):
        assert getattr(fast, field) == getattr(full, field), field
    assert set(fast.allowed) == {("cpu", block[1]) for block in blocks}


def test_a_grad_or_a_graph_on_the_block_takes_the_full_search():
    import torch

    from torchmem.leaks.owners import AllowedRoot

    instance = _Instance()
    instance.leaf = torch.ones(16, requires_grad=True)
    instance.leaf.grad = torch.zeros(16)
    instance.out = instance.leaf * 2
    blocks = [("cpu", instance.leaf.grad.untyped_storage().data_ptr(), 64)]
    fast, full = _search_both_ways(blocks, [AllowedRoot("self", instance, "the test instance")])
    assert fast.heap_listed
    assert (fast.owners, fast.allowed) == (full.owners, full.allowed)


def test_a_view_of_a_temporary_is_decided_from_the_roots_unless_its_base_is_held_elsewhere():
    import torch

    from torchmem.leaks.owners import AllowedRoot

    # As gpytorch's test_delta.py setUp: the view holds its base (the arange) from C++ only.
    instance = _Instance()
    instance.batch = torch.arange(0.0, 256.0).unsqueeze(1).expand(256, 3)
    blocks = [("cpu", instance.batch.untyped_storage().data_ptr(), 1024)]
    roots = [AllowedRoot("self", instance, "the test instance")]
    fast, full = _search_both_ways(blocks, roots)
    assert not fast.heap_listed and full.heap_listed
    for field in ("owners", "allowed", "notes", "unnamed", "held_outside", "live_rooted", "stopped_early"):
        assert getattr(fast, field) == getattr(full, field), field
    assert set(fast.allowed) == {("cpu", blocks[0][1])}

    _ELSEWHERE.append(instance.batch._base)  # the base held by a global too: the full search names it
    try:
        fast, full = _search_both_ways(blocks, roots)
        assert fast.heap_listed
        assert (fast.owners, fast.allowed) == (full.owners, full.allowed)
        assert not fast.allowed
        assert any("_ELSEWHERE[0]" in owner.path for owner in fast.owners[("cpu", blocks[0][1])])
    finally:
        _ELSEWHERE.clear()
