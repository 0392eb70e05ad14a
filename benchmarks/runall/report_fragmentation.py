"""Section 4 of the report: the traces replayed, torchmem against PyTorch's native
allocator (peak reserved, fragmentation)."""

from __future__ import annotations

from runall.common import fmt, format_bytes, read_jsonl


class FragmentationSection:
    """Mixin of Report (see report.py for the helpers it uses)."""

    def fragmentation(self) -> None:
        engine = {r["trace"]: r for r in read_jsonl(self.raw / "replay_engine.jsonl")}
        native = {r["trace"]: r for r in read_jsonl(self.raw / "replay_native.jsonl")}
        tmcuda = {r["trace"]: r for r in read_jsonl(self.raw / "replay_torchmem_cuda.jsonl")}
        if not self.begin_section(
                "## 4. Fragmentation: the traces replayed, torchmem vs PyTorch's native allocator",
                "fragmentation", bool(engine and native),
                (("Peak reserved ≤ native on every trace", "every trace"),)):
            return
        traces = [t for t in engine if t in native]
        self.w(f"{len(traces)} traces (the `--traces` given). torchmem: `trace_replay` (its engine "
               "over a backend of address ranges, C++); native: `trace_replay_native.py`, "
               "`torch.cuda.caching_allocator_alloc/delete` on the simulated device with PyTorch's "
               "defaults; both from an empty cache, same replay rules (a `free` of an address not "
               "allocated in the trace is ignored; `segment_*` rows are not inputs). Peak requested "
               "= the largest sum of live requested bytes. tm/native = torchmem's peak reserved "
               "over native's. Warm = the trace replayed again on the warm cache (survivors freed "
               "after each pass, like the steps of a training loop): its peak reserved ratio. "
               "\"via CUDA\" = the same Python replay through torchmem's CUDA allocator "
               "(`torchmem.install()`) on the simulated device: a cross-check of the engine "
               "figure through the real integration. ns/op: thread CPU time per operation, "
               "warm passes, median; engine = C++ calls; native and via-CUDA = through Python, "
               "minus the same loop over no-op functions.")
        self.w()
        rows = []
        worse, worse_warm, worse_cuda, ratios = [], [], [], []
        totals = {"req": 0, "nat": 0, "tm": 0}
        for t in traces:
            e, n, c = engine[t], native[t], tmcuda.get(t)
            r = e["peak_reserved_bytes"] / n["peak_reserved_bytes"] if n["peak_reserved_bytes"] else float("nan")
            ratios.append((r, t))
            if e["peak_reserved_bytes"] > n["peak_reserved_bytes"]:
                worse.append(t)
            we, wn = e.get("warm_peak_reserved_bytes"), n.get("warm_peak_reserved_bytes")
            warm_r = we / wn if we and wn else None
            if warm_r is not None and warm_r > 1:
                worse_warm.append(t)
            cuda_r = None
            if c is not None and n["peak_reserved_bytes"]:
                cuda_r = c["peak_reserved_bytes"] / n["peak_reserved_bytes"]
                if cuda_r > 1:
                    worse_cuda.append((t, c["peak_reserved_bytes"] - n["peak_reserved_bytes"], cuda_r))
            totals["req"] += e["peak_requested_bytes"]
            totals["nat"] += n["peak_reserved_bytes"]
            totals["tm"] += e["peak_reserved_bytes"]

            def py_ns(row):
                if row is None or row.get("warm_ns_per_op") is None:
                    return None
                return row["warm_ns_per_op"] - row.get("python_loop_ns_per_op", 0)
            rows.append([
                f"`{t}`", fmt(e["ops_replayed"]), format_bytes(e["peak_requested_bytes"]),
                format_bytes(n["peak_reserved_bytes"]), format_bytes(e["peak_reserved_bytes"]),
                f"{n['peak_reserved_over_peak_requested']:.3f}",
                f"{e['peak_reserved_over_peak_requested']:.3f}",
                f"**{r:.3f}**" if r > 1 else f"{r:.3f}",
                "-" if warm_r is None else f"{warm_r:.3f}",
                "-" if cuda_r is None else (f"**{cuda_r:.4f}**" if cuda_r > 1 else f"{cuda_r:.4f}"),
                fmt(e.get("warm_ns_per_op")), fmt(py_ns(n)), fmt(py_ns(c))])
        self.table(["trace", "ops", "peak requested", "native reserved", "torchmem reserved",
                    "native res/req", "torchmem res/req", "tm / native", "warm tm / native",
                    "via CUDA tm / native", "ns/op engine", "ns/op native", "ns/op via CUDA"],
                   rows, "lrrrrrrrrrrrr")
        self.w(f"Sum over traces: peak requested {format_bytes(totals['req'])}, native reserved "
               f"{format_bytes(totals['nat'])}, torchmem reserved {format_bytes(totals['tm'])} "
               f"({totals['tm'] / totals['nat']:.4f}×). Same device allocations: "
               f"{sum(engine[t]['num_device_alloc'] == native[t]['num_device_alloc'] for t in traces)}"
               f" of {len(traces)} traces.")
        self.w()
        if worse_cuda:
            self.w("Through torchmem's CUDA allocator on the simulated device, peak reserved is "
                   "above native's on " + ", ".join(
                       f"`{t}` (+{format_bytes(delta)}, {r:.4f}×)" for t, delta, r in worse_cuda)
                   + ". The engine is the one the replay above runs; what differs is the "
                   "segment addresses it gets (the simulated device hands them out top down, the "
                   "replay backend bottom up). Best fit breaks ties between equal-sized free "
                   "blocks by segment age, then address, as PyTorch 2.14 does, so addresses alone "
                   "should not change placement: this is a divergence from PyTorch's policy "
                   "to investigate (compare placements op by op, e.g. with "
                   "`torchmem.record_trace()` against `torch.cuda.memory._record_memory_history`).")
            self.w()
        max_r, max_t = max(ratios)
        # Through the CUDA integration is what a user gets: it must hold there too.
        met = not worse and not worse_cuda
        detail = f"worse on {len(worse)} of {len(traces)}; max {max_r:.4f}× (`{max_t}`)"
        detail += f"; warm passes: worse on {len(worse_warm)}"
        if tmcuda:
            detail += f"; via CUDA: worse on {len(worse_cuda)}"
        self.goal("Peak reserved ≤ native on every trace", "every trace",
                  f"{len(traces) - len(worse)} of {len(traces)} traces", met, detail)
        if not met:
            self.misses.append("fragmentation")
        self.plot_fragmentation(traces, engine, native)

    def analysis_fragmentation(self) -> None:
        if "fragmentation" in self.misses:
            self.w("**Fragmentation.** See the bold ratios in section 4.")
            self.w()
