"""The report's figures, drawn with matplotlib when it is installed (the report is
complete without them)."""

from __future__ import annotations

from runall.common import ENGINE_BUDGET_NS, ENGINE_TAG_BUDGET_NS, GIB, size_label


class Plots:
    """Mixin of Report: each plot_* saves a PNG next to the report and records its caption
    in ``self.plots``."""

    def _plt(self):
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            return plt
        except ImportError:
            return None

    def _save(self, fig, name: str, caption: str) -> None:
        fig.tight_layout()
        fig.savefig(self.out / name, dpi=110)
        self._plt().close(fig)
        self.plots[name] = caption

    def plot_engine(self, data) -> None:
        plt = self._plt()
        if plt is None:
            return
        groups = [(w, t) for w in ("one_size", "trace_mix") for t in (1, 2)]
        series = [("engine", "engine/{w}/plain"), ("engine +tag +scope", "engine/{w}/tag_scope"),
                  ("toy", "toy/{w}"), ("std_set", "std_set/{w}")]
        fig, ax = plt.subplots(figsize=(8, 4))
        width = 0.2
        for i, (label, pattern) in enumerate(series):
            values = [data.get((pattern.format(w=w), t), {}).get("cpu", 0) or 0 for w, t in groups]
            ax.bar([g + (i - 1.5) * width for g in range(len(groups))], values, width, label=label)
        ax.axhline(ENGINE_BUDGET_NS, color="k", ls="--", lw=1, label="budget, no tag (50 ns)")
        ax.axhline(ENGINE_TAG_BUDGET_NS, color="grey", ls=":", lw=1, label="budget, tag+scope (80 ns)")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{w.replace('_', ' ')}\n{t} thread{'s' if t > 1 else ''}"
                            for w, t in groups])
        ax.set_ylabel("ns per alloc+free pair (CPU time)")
        ax.set_title("Engine hot path vs baselines")
        ax.legend(fontsize=8)
        self._save(fig, "engine.png", "Engine: CPU ns per alloc+free pair by variant, with the budgets")

    def plot_cuda(self, d) -> None:
        plt = self._plt()
        if plt is None:
            return
        variants = d["variants"]
        cases = [c for c in d["cases"] if not c.endswith("/floor")]
        norm = d.get("normalized_medians", d["medians"])
        floors = d.get("floors") or {}
        fig, ax = plt.subplots(figsize=(10, 4.5))
        width = 0.8 / len(variants)
        for i, v in enumerate(variants):
            ax.bar([j + (i - (len(variants) - 1) / 2) * width for j in range(len(cases))],
                   [norm[v][c] for c in cases], width, label=v)
        apis = []
        for c in cases:
            if c.split("/")[0] not in apis:
                apis.append(c.split("/")[0])
        for k, api in enumerate(apis):
            idx = [j for j, c in enumerate(cases) if c.startswith(api + "/")]
            if api in floors:
                ax.hlines(floors[api], idx[0] - 0.45, idx[-1] + 0.45, colors="k", linestyles="--",
                          lw=1, label="shared floor (no allocator call)" if k == 0 else None)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels([f"{c.split('/')[0]}\n{size_label(int(c.split('/')[1]))}"
                            for c in cases], fontsize=8)
        ax.set_ylabel("ns per alloc + free (CPU time, floor-normalized)")
        ax.set_title("CUDA end to end on the simulated device, by variant")
        ax.legend(fontsize=8)
        self._save(fig, "cuda_e2e.png", "CUDA end to end: ns per alloc+free by case and variant")

    def plot_cpu(self, d) -> None:
        plt = self._plt()
        if plt is None:
            return
        rows = [r for r in d["rows"] if r["bytes"] > 0]
        floor = next((r for r in d["rows"] if r["bytes"] == 0), None)
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = [r["bytes"] for r in rows]
        ax.plot(xs, [r["default_ns"] for r in rows], "o-", label="default (glibc)")
        ax.plot(xs, [r["torchmem_ns"] for r in rows], "s-", label="torchmem")
        if floor:
            ax.axhline(floor["default_ns"], color="grey", ls=":", lw=1,
                       label="floor (0-byte tensor)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([size_label(x) for x in xs], rotation=45, fontsize=8)
        ax.set_ylabel("ns per torch.empty + del (CPU time)")
        ax.set_title("CPU tensors by size")
        ax.legend(fontsize=8)
        self._save(fig, "cpu_tensors.png", "CPU tensors: ns per torch.empty + del by size")

    def plot_fragmentation(self, traces, engine, native, expandable=None, vmm=None) -> None:
        plt = self._plt()
        if plt is None:
            return
        series = [("PyTorch default peak reserved", native),
                  ("PyTorch expandable peak reserved", expandable or {}),
                  ("torchmem PyTorch-identical peak reserved", engine),
                  ("torchmem VMM peak reserved", vmm or {})]
        series = [(label, data) for label, data in series if all(t in data for t in traces)]
        bars = len(series) + 1
        fig, ax = plt.subplots(figsize=(9, 0.32 * len(traces) * bars / 3 + 1.5))
        ys = range(len(traces))
        h = 0.8 / bars
        for i, (label, data) in enumerate(series):
            ax.barh([y + (i - (bars - 1) / 2) * h for y in ys],
                    [data[t]["peak_reserved_bytes"] / GIB for t in traces], h, label=label)
        ax.barh([y + (bars - 1) / 2 * h for y in ys],
                [engine[t]["peak_requested_bytes"] / GIB for t in traces], h,
                label="peak requested", color="lightgrey")
        ax.set_yticks(list(ys))
        ax.set_yticklabels(traces, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("GiB (log scale)")
        ax.set_title("Peak reserved per trace: PyTorch's allocators and torchmem")
        ax.legend(fontsize=8)
        self._save(fig, "fragmentation.png", "Peak reserved per trace, torchmem vs native")
