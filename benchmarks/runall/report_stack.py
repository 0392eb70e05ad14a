"""Section 5 of the report: what stack capture costs per allocation, next to PyTorch's
``_record_memory_history``."""

from __future__ import annotations

import json
import statistics

from runall.common import fmt, size_label


class StackSection:
    """Mixin of Report (see report.py for the helpers it uses)."""

    def stack(self) -> None:
        path = self.raw / "stack_capture.json"
        if not self.begin_section("## 5. Stack capture overhead", "stack", path.exists()):
            return
        d = json.loads(path.read_text())
        self.w(f"`stack_capture_overhead.py`: CPU tensors through torchmem, `torch.empty(256)` + "
               f"`del`, capture off and on alternating within {d['rounds']} rounds of "
               f"{d['iterations']:,} iterations, {d['clock']} time; on − off is the median of "
               "the per-round differences: what capture adds to one allocation whose stack was "
               "seen before, by the number of Python frames at the allocation.")
        self.w()
        rows = [[r["frames"], fmt(r["off_ns"]), fmt(r["on_ns"]), fmt(r["paired_on_minus_off_ns"])]
                for r in d["rows"]]
        first = d["first_sight"]
        rows.append(["first sight of a stack", fmt(first["off_ns"]), fmt(first["on_ns"]),
                     fmt(first["on_ns"] - first["off_ns"])])
        self.table(["Python frames", "capture off ns", "capture on ns", "on − off ns"], rows)
        cuda = getattr(self, "cuda_data", None)
        if cuda is not None:
            med = cuda.get("normalized_medians", cuda["medians"])
            cases = [c for c in cuda["cases"] if not c.endswith("/floor")]
            rows = []
            for c in cases:
                api, what = c.split("/")
                row = [f"{api} {size_label(int(what))}"]
                if "torchmem_leak_check" in med and "torchmem" in med:
                    row.append(fmt(med["torchmem_leak_check"][c] - med["torchmem"][c]))
                else:
                    row.append("-")
                if "native_history" in med:
                    row.append(fmt(med["native_history"][c] - med["native"][c]))
                else:
                    row.append("-")
                rows.append(row)
            self.w(f"End to end on the simulated CUDA device ({cuda['frames']} frames deep, from "
                   "section 2, floor-normalized figures): what recording allocation stacks adds "
                   "per alloc + free — "
                   "torchmem inside a leak_check (scope + Python stack capture) minus plain "
                   "torchmem, and PyTorch's `_record_memory_history(stacks=\"python\")` minus "
                   "plain native (separate processes, so each difference carries the noise of "
                   "two medians):")
            self.w()
            self.table(["case", "torchmem leak_check − torchmem ns",
                        "native _record_memory_history − native ns"], rows)
        depth30 = min(d["rows"], key=lambda r: abs(r["frames"] - 30))
        pytorch_ns, source = float(d.get("pytorch_record_history_cited_ns", 2000)), "cited"
        if cuda is not None and "native_history" in cuda["medians"]:
            med = cuda.get("normalized_medians", cuda["medians"])
            pytorch_ns = statistics.median(
                med["native_history"][c] - med["native"][c] for c in cuda["cases"]
                if not c.endswith("/floor") and c.split("/")[0] in ("empty", "cca"))
            source = "measured in section 2"
        last = d["rows"][-1]
        self.goal("Stack capture per allocation, steady state (DESIGN.md)",
                  f"well under (≤ ½ of) PyTorch's `_record_memory_history`: {pytorch_ns:,.0f} ns "
                  f"({source})", f"{depth30['paired_on_minus_off_ns']:.0f} ns at "
                  f"{depth30['frames']} frames", depth30["paired_on_minus_off_ns"] <= pytorch_ns / 2,
                  f"{last['paired_on_minus_off_ns']:.0f} ns at {last['frames']} frames; first "
                  f"sight of a stack {first['on_ns'] - first['off_ns']:.0f} ns, once per site")
