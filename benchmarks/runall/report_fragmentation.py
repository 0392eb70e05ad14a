"""Section 4 of the report: the traces replayed through PyTorch's allocators and torchmem's
(peak reserved, fragmentation), in issue 12's four columns: PyTorch default, PyTorch
``expandable_segments:True``, torchmem PyTorch-identical, torchmem VMM."""

from __future__ import annotations

import math

from runall.common import fmt, format_bytes, read_jsonl

# Issue 12's goals for torchmem's VMM backend.
VMM_GEOMEAN_VS_DEFAULT = 0.90
VMM_REQUESTED_OVER_RESERVED_GEOMEAN = 0.95
VMM_REQUESTED_OVER_RESERVED_WORST = 0.85
VMM_GOALS = (
    ("VMM: peak reserved ≤ min(PyTorch default, expandable) on every trace", "every trace"),
    ("VMM: peak reserved vs PyTorch default, geomean", f"≤ {VMM_GEOMEAN_VS_DEFAULT:.2f}×"),
    ("VMM: peak requested / peak reserved",
     f"≥ {VMM_REQUESTED_OVER_RESERVED_GEOMEAN:.2f} geomean, ≥ "
     f"{VMM_REQUESTED_OVER_RESERVED_WORST:.2f} worst"),
)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def by_trace(rows: list[dict]) -> dict[str, dict]:
    return {r["trace"]: r for r in rows}


def engine_rows(rows: list[dict], variant: str) -> dict[str, dict]:
    """trace_replay's rows of one engine variant (rows from before variants: "pytorch")."""
    return by_trace([r for r in rows if r.get("variant", "pytorch") == variant])


def mapped_through_vmm(row: dict) -> bool:
    """Whether the simulated device saw a replay through the driver's virtual memory (pages
    mapped, no cudaMalloc): the evidence a VMM figure needs."""
    calls = row.get("device_calls") or {}
    return calls.get("cuMemMap", 0) > 0 and calls.get("cudaMalloc", 0) == 0


def summary_rows(columns: list[tuple[str, dict]], traces: list[str], native: dict,
                 vmm_built: bool) -> dict[str, list[str]]:
    """Geomean and worst of each column's peak reserved over PyTorch default's, and of its
    peak requested / peak reserved; a column missing traces says how many it has."""
    summary: dict[str, list[str]] = {"geomean vs default": [], "worst vs default": [],
                                     "req/res geomean": [], "req/res worst": []}
    for name, data in columns:
        have = [t for t in traces if t in data]
        if len(have) < len(traces):
            for values in summary.values():
                values.append("not built" if name == "torchmem VMM" and not vmm_built
                              else f"{len(have)} of {len(traces)} traces")
            continue
        vs = {t: data[t]["peak_reserved_bytes"] / native[t]["peak_reserved_bytes"] for t in have}
        req = {t: data[t]["peak_requested_bytes"] / data[t]["peak_reserved_bytes"] for t in have}
        worst_t = max(have, key=vs.get)
        req_t = min(have, key=req.get)
        summary["geomean vs default"].append(f"{geomean(list(vs.values())):.3f}")
        summary["worst vs default"].append(f"{vs[worst_t]:.3f}" if data is native
                                           else f"{vs[worst_t]:.3f} (`{worst_t}`)")
        summary["req/res geomean"].append(f"{geomean(list(req.values())):.3f}")
        summary["req/res worst"].append(f"{req[req_t]:.3f} (`{req_t}`)")
    return summary


def per_1k(count: int, allocs: int) -> float:
    return 1000.0 * count / allocs if allocs else float("nan")


class FragmentationSection:
    """Mixin of Report (see report.py for the helpers it uses)."""

    def fragmentation(self) -> None:
        replayed = read_jsonl(self.raw / "replay_engine.jsonl")
        engine = engine_rows(replayed, "pytorch")
        native = {r["trace"]: r for r in read_jsonl(self.raw / "replay_native.jsonl")}
        tmcuda = {r["trace"]: r for r in read_jsonl(self.raw / "replay_torchmem_cuda.jsonl")}
        if not self.begin_section(
                "## 4. Fragmentation: the traces replayed, torchmem vs PyTorch's native allocator",
                "fragmentation", bool(engine and native),
                (("Peak reserved ≤ native on every trace", "every trace"),) + VMM_GOALS):
            return
        traces = [t for t in engine if t in native]
        self.four_columns(traces, replayed, native)
        self.w("### PyTorch-identical torchmem against PyTorch's default allocator")
        self.w()
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
        expandable = by_trace(read_jsonl(self.raw / "replay_native_expandable.jsonl"))
        vmm = engine_rows(replayed, "vmm")
        self.vmm_goals(traces, native, expandable, vmm,
                       by_trace(read_jsonl(self.raw / "replay_torchmem_cuda_vmm.jsonl")),
                       "vmm" in self.engine_variants(replayed))
        self.plot_fragmentation(traces, engine, native, expandable, vmm)

    def engine_variants(self, replayed: list[dict]) -> list[str]:
        """The engine variants the run's trace_replay had (from its rows, for older runs)."""
        return (self.meta.get("sections", {}).get("fragmentation", {}).get("engine_variants")
                or sorted({r.get("variant", "pytorch") for r in replayed}))

    def four_columns(self, traces: list[str], replayed: list[dict], native: dict) -> None:
        """Issue 12's table: peak reserved of PyTorch default, PyTorch expandable, torchmem
        PyTorch-identical and torchmem VMM, per trace, with the ratios and the goals."""
        expandable = by_trace(read_jsonl(self.raw / "replay_native_expandable.jsonl"))
        identical = engine_rows(replayed, "pytorch")
        vmm = engine_rows(replayed, "vmm")
        vmm_cuda = by_trace(read_jsonl(self.raw / "replay_torchmem_cuda_vmm.jsonl"))
        vmm_built = "vmm" in self.engine_variants(replayed)
        self.w("### Four columns: PyTorch default, PyTorch expandable, torchmem PyTorch-identical, "
               "torchmem VMM")
        self.w()
        self.w("Peak reserved per trace, each replay from an empty cache. PyTorch default and "
               "`expandable_segments:True`: PyTorch's own allocator on the simulated device "
               "(`trace_replay_native.py`, the second with "
               "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`: its segments grow by mapping "
               "20 MiB pages (2 MiB in the small pool) through the simulated driver's virtual "
               "memory API). torchmem: its engine (`trace_replay`, one engine variant per "
               "column: `pytorch` is the PyTorch-identical engine torchmem ships, `vmm` the "
               "virtual-memory backend of issue 12, \"not built\" until `trace_replay "
               "--list_variants` has it). In parentheses: the ratio to PyTorch default. "
               "req/res = peak requested / peak reserved.")
        self.w()
        columns = [("PyTorch default", native), ("PyTorch expandable", expandable),
                   ("torchmem PyTorch-identical", identical), ("torchmem VMM", vmm)]
        rows = []
        for t in traces:
            base = native[t]["peak_reserved_bytes"]
            row = [f"`{t}`", format_bytes(native[t]["peak_requested_bytes"])]
            for name, data in columns:
                r = data.get(t)
                if r is None:
                    row.append("not built" if name == "torchmem VMM" and not vmm_built
                               else "not run")
                elif name == "PyTorch default":
                    row.append(format_bytes(r["peak_reserved_bytes"]))
                else:
                    row.append(f"{format_bytes(r['peak_reserved_bytes'])} "
                               f"({r['peak_reserved_bytes'] / base:.3f}×)")
            rows.append(row)
        for label, values in summary_rows(columns, traces, native, vmm_built).items():
            rows.append([f"**{label}**", ""] + values)
        self.table(["trace", "peak requested"] + [name for name, _ in columns], rows)
        tmcuda = by_trace(read_jsonl(self.raw / "replay_torchmem_cuda.jsonl"))
        if tmcuda:
            vmm_mapped = {t: r for t, r in vmm_cuda.items() if mapped_through_vmm(r)}
            cuda_columns = [("PyTorch default", native), ("PyTorch expandable", expandable),
                            ("torchmem PyTorch-identical", tmcuda), ("torchmem VMM", vmm_mapped)]
            self.w("The same four columns through the CUDA path: torchmem's columns replayed "
                   "by the same Python replay as PyTorch's, through torchmem's CUDA allocator "
                   "(`torchmem.install()`; the VMM column with `expandable_segments:True`, "
                   "counted only where the device saw pages mapped and no `cudaMalloc`):")
            self.w()
            self.table(["through the CUDA path"] + [name for name, _ in cuda_columns],
                       [[f"**{label}**"] + values for label, values in
                        summary_rows(cuda_columns, traces, native, vmm_built).items()])
        self.driver_calls(traces, native, expandable, vmm, vmm_cuda)

    def driver_calls(self, traces, native, expandable, vmm, vmm_cuda) -> None:
        """Memory calls per 1,000 allocations in each trace's first replay."""
        have = [t for t in traces if t in expandable and expandable[t].get("device_calls")]
        if not have:
            return
        self.w("Device memory calls per 1,000 allocations in each trace's first replay, as the "
               "simulated device counted them (PyTorch default: `cudaMalloc` + `cudaFree`; "
               "expandable: `cuMemMap` + `cuMemUnmap`, and `cuMemCreate` apart; torchmem VMM "
               "through the CUDA path likewise, when built). Mapping calls are the expensive "
               "ones (PyTorch's note on expandable segments: milliseconds to map a whole "
               "device).")
        self.w()
        rows = []
        for t in have:
            d = native[t].get("device_calls") or {}
            e = expandable[t]["device_calls"]
            v = vmm_cuda.get(t, {}).get("device_calls")
            rows.append([
                f"`{t}`", fmt(expandable[t]["allocs"]),
                f"{per_1k(d.get('cudaMalloc', 0) + d.get('cudaFree', 0), native[t]['allocs']):,.1f}"
                if d else "-",
                f"{per_1k(e.get('cuMemMap', 0) + e.get('cuMemUnmap', 0), expandable[t]['allocs']):,.1f}",
                f"{per_1k(e.get('cuMemCreate', 0), expandable[t]['allocs']):,.1f}",
                f"{per_1k(v.get('cuMemMap', 0) + v.get('cuMemUnmap', 0), vmm_cuda[t]['allocs']):,.1f}"
                if v else ("not built" if not vmm else "-")])
        self.table(["trace", "allocations", "default cudaMalloc+cudaFree", "expandable "
                    "cuMemMap+cuMemUnmap", "expandable cuMemCreate", "torchmem VMM "
                    "cuMemMap+cuMemUnmap"], rows)

    def vmm_goals(self, traces, native, expandable, vmm, vmm_cuda, vmm_built) -> None:
        """Issue 12's goals, judged on the engine's VMM variant and, where it ran, through
        torchmem's CUDA allocator (which must show the device mapped pages)."""
        if not vmm_built or not all(t in vmm for t in traces):
            for name, budget in VMM_GOALS:
                self.goal(name, budget, "—", None, status="not built" if not vmm_built
                          else "not run")
            return
        if not all(t in expandable for t in traces):
            for name, budget in VMM_GOALS:
                self.goal(name, budget, "—", None, status="not run (no expandable baseline)")
            return
        sources = [("engine", vmm)]
        if vmm_cuda:
            not_mapped = [t for t in traces if not mapped_through_vmm(vmm_cuda.get(t, {}))]
            if not_mapped:
                self.w("**Not a VMM replay:** through torchmem's CUDA allocator with "
                       "`expandable_segments:True` the device saw no page mapped (or saw "
                       "`cudaMalloc`) on " + ", ".join(f"`{t}`" for t in not_mapped)
                       + ": those figures are not the VMM backend's and are left out.")
                self.w()
            sources.append(("via CUDA", {t: r for t, r in vmm_cuda.items()
                                         if mapped_through_vmm(r)}))
        for label, data in sources:
            have = [t for t in traces if t in data]
            if not have:
                continue
            best = {t: min(native[t]["peak_reserved_bytes"], expandable[t]["peak_reserved_bytes"])
                    for t in have}
            over = [t for t in have if data[t]["peak_reserved_bytes"] > best[t]]
            vs = [data[t]["peak_reserved_bytes"] / native[t]["peak_reserved_bytes"] for t in have]
            req = [data[t]["peak_requested_bytes"] / data[t]["peak_reserved_bytes"] for t in have]
            names = [f"{name} ({label})" for name, _ in VMM_GOALS]
            budgets = [budget for _, budget in VMM_GOALS]
            worst_vs_best = max(data[t]["peak_reserved_bytes"] / best[t] for t in have)
            self.goal(names[0], budgets[0], f"{len(have) - len(over)} of {len(have)} traces",
                      not over and len(have) == len(traces),
                      f"max {worst_vs_best:.3f}× the smaller baseline"
                      + (f"; over on {', '.join(f'`{t}`' for t in over)}" if over else ""))
            self.goal(names[1], budgets[1], f"{geomean(vs):.3f}×",
                      geomean(vs) <= VMM_GEOMEAN_VS_DEFAULT, f"worst {max(vs):.3f}×")
            self.goal(names[2], budgets[2], f"{geomean(req):.3f} geomean, {min(req):.3f} worst",
                      geomean(req) >= VMM_REQUESTED_OVER_RESERVED_GEOMEAN
                      and min(req) >= VMM_REQUESTED_OVER_RESERVED_WORST)

    def analysis_fragmentation(self) -> None:
        if "fragmentation" in self.misses:
            self.w("**Fragmentation.** See the bold ratios in section 4.")
            self.w()
