"""torchmem.leak_check: what is reported, how it is classified, and how misuse fails."""

from __future__ import annotations

import json
import threading

import pytest
import torch

import torchmem
from leak_helpers import block_of, collector_paused, line_of, owner_paths, site_of, torchmem_cpu  # noqa: F401
from torchmem import _C
from torchmem.leaks.check import _OpenCheck
from torchmem.leaks.classify import Classifier, still_allocated
from torchmem.leaks.report import LeakReport
from torchmem.leaks import tensors

KEPT: list = []


@pytest.fixture(autouse=True)
def empty_kept():
    KEPT.clear()
    yield
    KEPT.clear()


class Node:
    """An object that refers to itself: freed only by the cyclic garbage collector."""

    def __init__(self, payload):
        self.payload = payload
        self.me = self


def keep_one_tensor():
    KEPT.append(torch.zeros(1000))  # alloc: kept


def make_self_cycle():
    Node(torch.ones(256))  # alloc: cycle


# --- what is reported ---------------------------------------------------------------


def test_block_left_in_a_global_is_reachable_and_names_its_holder():
    with torchmem.leak_check(raise_on_leak=False) as report:
        keep_one_tensor()

    (finding,) = report.findings
    assert finding.kind == "reachable"
    assert owner_paths(finding) == [f"{__name__}.KEPT[0]"]
    assert finding.owners[0].kind == "global"


def test_a_block_in_a_one_element_tuple_names_the_tuple_not_the_searchs_own_tuples():
    # The search asks gc.get_referrers(*frontier), whose argument tuple refers to the
    # frontier too (Python 3.13 returns it): that tuple is skipped, a user's tuple is not.
    global KEPT_IN_A_TUPLE
    with torchmem.leak_check(raise_on_leak=False) as report:
        KEPT_IN_A_TUPLE = (torch.zeros(1000),)
    try:
        (finding,) = report.findings
        assert owner_paths(finding) == [f"{__name__}.KEPT_IN_A_TUPLE[0]"]
    finally:
        KEPT_IN_A_TUPLE = None


def test_a_block_held_only_by_a_bare_storage_names_the_storages_holder():
    with torchmem.leak_check(raise_on_leak=False) as report:
        KEPT.append(torch.UntypedStorage(4096))

    (finding,) = report.findings
    assert finding.kind == "reachable"
    if tensors._BARE_STORAGES_ARE_READABLE:
        assert owner_paths(finding) == [f"{__name__}.KEPT[0]"]
    else:  # torch 2.9 and 2.10: found, reported, its holder not named (tensors.py says why)
        assert f"{__name__}.KEPT[0]" not in owner_paths(finding)


def test_each_finding_carries_size_tag_device_stream_sequence_and_allocation_line():
    with torchmem.leak_check(raise_on_leak=False) as report:
        with torchmem.tag("kept"):
            keep_one_tensor()

    (finding,) = report.findings
    block = block_of(KEPT[0])
    assert (finding.address, finding.size, finding.sequence) == (block["address"], block["size"], block["sequence"])
    assert finding.requested_size == 4000 and finding.size >= 4000
    assert (finding.device, finding.tag, finding.stream) == ("cpu", "kept", 0)
    assert site_of(finding) == (__file__, line_of(keep_one_tensor, "# alloc: kept"))


def test_report_text_shows_size_tag_holder_and_the_allocating_line():
    with torchmem.leak_check(raise_on_leak=False) as report:
        with torchmem.tag("kept"):
            keep_one_tensor()

    text = report.render()
    assert "4.0 KiB  reachable  cpu  tag=kept" in text
    assert f"held by       {__name__}.KEPT[0]" in text
    assert f"test_leak_check.py:{line_of(keep_one_tensor, '# alloc: kept')}  KEPT.append(torch.zeros(1000))" in text


def test_a_leak_raises_leak_error_an_assertion_error_carrying_the_report():
    with pytest.raises(torchmem.LeakError) as raised:
        with torchmem.leak_check():
            keep_one_tensor()

    assert isinstance(raised.value, AssertionError)
    assert raised.value.report.leaked_bytes == raised.value.report.reachable[0].size
    assert str(raised.value) == raised.value.report.render()


def test_a_region_that_frees_everything_has_no_findings_and_runs_no_collection():
    with torchmem.leak_check() as report:
        total = (torch.ones(100) * 2).sum().item()

    assert total == 200
    assert report.findings == [] and report.finished
    assert not report.gc_collected
    assert report.render() == "torchmem.leak_check: no leaks"


def test_memory_the_allocator_keeps_cached_is_not_a_leak():
    with torchmem.leak_check() as report:
        big = torch.empty(4 << 20, dtype=torch.uint8)
        del big

    stats = torchmem.memory_stats("cpu")
    assert stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"] >= 4 << 20
    assert report.findings == []


def test_a_block_held_only_by_a_reference_cycle_is_a_cycle_finding_naming_the_cycle():
    with collector_paused():
        with torchmem.leak_check(raise_on_leak=False) as report:
            make_self_cycle()

    (finding,) = report.findings
    assert finding.kind == "cycle"
    assert finding.cycle_types == ("Node",)
    assert owner_paths(finding) == ["<Node>.payload"]
    assert finding.cycle == "Node.me is the same Node"
    assert site_of(finding) == (__file__, line_of(make_self_cycle, "# alloc: cycle"))
    assert "(reference cycle: freed only by gc)" in report.render()
    assert not still_allocated(_C.cpu_engine(), {"address": finding.address, "sequence": finding.sequence})


def test_without_gc_collect_cycle_garbage_counts_as_reachable():
    with collector_paused():
        with torchmem.leak_check(raise_on_leak=False, gc_collect=False) as report:
            make_self_cycle()

    (finding,) = report.findings
    assert finding.kind == "reachable"
    assert "gc_collect=False" in finding.note
    assert not report.gc_collected


def test_a_reused_address_is_not_mistaken_for_the_block_that_was_there():
    first = torch.empty(1000)
    old_block = block_of(first)
    del first
    second = torch.empty(1000)  # the cache hands the same address straight back

    assert block_of(second)["address"] == old_block["address"]
    assert not still_allocated(_C.cpu_engine(), old_block)
    assert still_allocated(_C.cpu_engine(), block_of(second))


def test_blocks_with_an_allowed_tag_are_allowed_not_leaked():
    with torchmem.leak_check(allow_tags=("cache",)) as report:
        with torchmem.tag("cache"):
            keep_one_tensor()

    (finding,) = report.findings
    assert finding.kind == "allowed" and finding.note == "tag 'cache' is allowed"
    assert report.leaked_bytes == 0
    assert report.render().startswith("torchmem.leak_check: no leaks; allowed 4.0 KiB in 1 block")


def test_expect_alive_allows_that_tensor_and_returns_it():
    with torchmem.leak_check() as report:
        kept = torchmem.expect_alive(torch.zeros(10))
        KEPT.append(kept)

    assert KEPT[0] is kept
    (finding,) = report.findings
    assert finding.kind == "allowed" and finding.note == "declared with torchmem.expect_alive"


def test_expect_alive_allows_nothing_else():
    with torchmem.leak_check(raise_on_leak=False) as report:
        KEPT.append(torchmem.expect_alive(torch.zeros(10)))
        keep_one_tensor()

    assert [finding.kind for finding in report.findings] == ["allowed", "reachable"]


def test_expect_alive_outside_any_check_does_nothing():
    tensor = torch.zeros(3)
    assert torchmem.expect_alive(tensor) is tensor


def test_a_reused_check_allows_what_its_warmup_entries_leave_then_reports():
    check = torchmem.leak_check(warmup=1, raise_on_leak=False)

    with check as first:
        keep_one_tensor()
    with check as second:
        keep_one_tensor()

    assert [f.kind for f in first.findings] == ["allowed"] and first.warmup
    assert first.findings[0].note == "warm-up entry 1 of 1"
    assert [f.kind for f in second.findings] == ["reachable"] and not second.warmup
    assert owner_paths(second.findings[0]) == [f"{__name__}.KEPT[1]"]
    assert check.entries == 2 and check.report is second


def test_as_a_decorator_each_call_is_checked_and_returned_tensors_are_allowed():
    @torchmem.leak_check()
    def make_result():
        return torch.ones(8) * 3

    @torchmem.leak_check()
    def leak():
        keep_one_tensor()

    result = make_result()
    assert result.tolist() == [3.0] * 8
    assert make_result.__name__ == "make_result"
    with pytest.raises(torchmem.LeakError, match=r"KEPT\[0\]"):
        leak()


def test_a_recursive_decorated_function_is_checked_once_by_its_outermost_call():
    check = torchmem.leak_check()

    @check
    def countdown(n):
        return 0 if n == 0 else countdown(n - 1) + int(torch.ones(1).item())

    assert countdown(3) == 3
    assert check.entries == 1


def test_max_leaked_bytes_tolerates_leaks_up_to_the_limit():
    with torchmem.leak_check(max_leaked_bytes=4096) as report:
        keep_one_tensor()
    assert report.leaked_bytes == 4096 and not report.exceeds_limit

    with pytest.raises(torchmem.LeakError, match="limit 4.0 KiB"):
        with torchmem.leak_check(max_leaked_bytes="4 KiB"):
            keep_one_tensor()
            keep_one_tensor()


def test_nested_checks_each_report_what_was_left_inside_them():
    with torchmem.leak_check(raise_on_leak=False) as outer:
        keep_one_tensor()
        with torchmem.leak_check(raise_on_leak=False) as inner:
            keep_one_tensor()

    assert owner_paths(inner.findings[0]) == [f"{__name__}.KEPT[1]"]
    assert sorted(path for f in outer.findings for path in owner_paths(f)) == [
        f"{__name__}.KEPT[0]", f"{__name__}.KEPT[1]",
    ]


def test_a_check_of_only_devices_torchmem_does_not_serve_refuses_instead_of_seeing_nothing():
    # It used to report no findings: it could see nothing there (issue 23).
    with pytest.raises(RuntimeError, match=r"devices=\['cuda:0'\] but torchmem serves only cpu.*install"):
        with torchmem.leak_check(devices=["cuda:0"]):
            keep_one_tensor()


def test_pending_blocks_are_listed_but_not_leaked():
    pending_block = {
        "address": 4096, "size": 512, "requested_size": 100, "stream": 7, "pool": "small_pool",
        "state": "pending", "tag": None, "scope": 1, "context": 0, "sequence": 1,
    }
    check = torchmem.leak_check()
    entry = _OpenCheck(scope=0, thread=threading.get_ident(), report=LeakReport(), site="here")

    Classifier(check, entry, [{"device": "cpu", "allocated": [], "pending": [pending_block]}]).run()

    (finding,) = entry.report.findings
    assert (finding.kind, finding.stream, finding.note) == ("pending", 7, "freed, waiting for other streams' events")
    assert entry.report.leaked_bytes == 0


def test_the_report_converts_to_plain_data_and_json():
    with torchmem.leak_check(raise_on_leak=False) as report:
        keep_one_tensor()

    data = json.loads(report.to_json())
    assert data == report.to_dict()
    assert data["totals"]["reachable"] == {"blocks": 1, "bytes": 4096}
    (finding,) = data["findings"]
    assert finding["owners"] == [{"path": f"{__name__}.KEPT[0]", "kind": "global", "location": None}]
    assert finding["frames"][0] == {
        "filename": __file__, "line": line_of(keep_one_tensor, "# alloc: kept"), "name": "keep_one_tensor",
    }


def test_when_the_body_raises_its_error_propagates_and_nothing_is_analyzed():
    with pytest.raises(ZeroDivisionError):
        with torchmem.leak_check() as report:
            keep_one_tensor()
            1 / 0

    assert report.aborted == "ZeroDivisionError: division by zero"
    assert report.findings == []
    assert "not analyzed" in report.render()


def test_stack_capture_is_on_only_while_a_check_is_open():
    assert not _C.stack_capture_requested()
    with torchmem.leak_check():
        assert _C.stack_capture_requested()
    assert not _C.stack_capture_requested()


def test_without_capture_stacks_findings_have_no_frames():
    with torchmem.leak_check(raise_on_leak=False, capture_stacks=False) as report:
        keep_one_tensor()

    assert report.findings[0].frames == ()
    assert "no stack recorded" in report.render()


# --- misuse -------------------------------------------------------------------------


def test_exiting_twice_is_an_error_that_says_so():
    check = torchmem.leak_check()
    with check:
        pass

    with pytest.raises(RuntimeError, match="exited without a matching enter"):
        check.__exit__(None, None, None)


def test_exiting_out_of_order_is_an_error_and_leaves_both_checks_usable():
    outer, inner = torchmem.leak_check(), torchmem.leak_check()
    outer.__enter__()
    inner.__enter__()

    with pytest.raises(RuntimeError, match="exited out of order"):
        outer.__exit__(None, None, None)

    inner.__exit__(None, None, None)
    outer.__exit__(None, None, None)
    assert outer.report.finished and inner.report.finished


def test_re_entering_an_open_check_is_an_error():
    check = torchmem.leak_check()
    with check:
        with pytest.raises(RuntimeError, match="already open"):
            check.__enter__()


def test_a_check_must_be_exited_on_the_thread_that_entered_it():
    check = torchmem.leak_check()
    check.__enter__()
    errors = []

    def exit_elsewhere():
        try:
            check.__exit__(None, None, None)
        except RuntimeError as error:
            errors.append(str(error))

    worker = threading.Thread(target=exit_elsewhere)
    worker.start()
    worker.join()
    check.__exit__(None, None, None)

    assert len(errors) == 1 and "exit it on the thread that entered it" in errors[0]


def test_expect_alive_rejects_what_is_not_a_tensor():
    with pytest.raises(TypeError, match="expected a torch.Tensor, got list"):
        torchmem.expect_alive([1, 2])


def test_tags_must_be_strings():
    with pytest.raises(TypeError, match=r"allow_tags must contain tag names \(str\), got 3 \(int\)"):
        torchmem.leak_check(allow_tags=("ok", 3))
    with pytest.raises(TypeError, match="the name must be a str, got int"):
        torchmem.tag(5)
    assert torchmem.leak_check(allow_tags="cache").allow_tags == frozenset({"cache"})


def test_bad_settings_are_rejected_with_what_to_write_instead():
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        torchmem.leak_check(warmup=-1)
    with pytest.raises(ValueError, match="is not a size"):
        torchmem.leak_check(max_leaked_bytes="a lot")
    with pytest.raises(TypeError, match="decorates a function"):
        torchmem.leak_check()(5)
    with pytest.raises(ValueError, match="unknown kind"):
        LeakReport().of_kind("leaky")


def test_a_raw_scope_left_open_inside_a_check_must_be_closed_first():
    check = torchmem.leak_check()
    check.__enter__()
    raw_scope = _C.open_scope()

    with pytest.raises(RuntimeError, match="still open: close that first"):
        check.__exit__(None, None, None)

    _C.close_scope(raw_scope)
    check.__exit__(None, None, None)
    assert check.report.finished


def test_a_scope_closed_behind_the_checks_back_is_reported_and_the_check_released():
    check = torchmem.leak_check()
    report = check.__enter__()
    _C.close_scope(check._open.scope)

    with pytest.raises(RuntimeError, match="its scope was already closed"):
        check.__exit__(None, None, None)

    assert not report.finished
    assert not _C.stack_capture_requested()
    with check:  # usable again
        pass


def test_a_site_deep_in_installed_packages_also_names_where_the_users_code_called_in():
    # torchmetrics (an installed package) allocates five frames deep; the report shows
    # its first frames and then the user's own line that called into it.
    import torchmetrics

    from torchmem.leaks.render import _stack_lines
    from torchmem.leaks.report import Finding
    from torchmem.stacks.frames import Frame

    library = torchmetrics.__file__
    frames = tuple(Frame(library, line, f"inner{line}") for line in (10, 20, 30, 40, 50)) + (
        Frame(__file__, 7, "train_step"),
    )
    finding = Finding(kind="reachable", device="cpu", address=0, size=512, requested_size=4,
                      tag=None, stream=0, frames=frames)
    lines = _stack_lines(finding)
    assert len(lines) == 5
    assert lines[0].startswith("torchmetrics/__init__.py:10")
    assert lines[-1].startswith("called from ") and f":7  " in lines[-1]
    assert lines[-1].endswith(open(__file__).read().splitlines()[6].strip())
