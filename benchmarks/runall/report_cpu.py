"""Section 3 of the report: CPU tensors, the default CPU allocator against torchmem, and the
analysis when the speedup goal is missed."""

from __future__ import annotations

import json

from runall.common import CPU_GOAL_MIN_BYTES, CPU_SPEEDUP_GOAL, fmt, size_label


class CpuSection:
    """Mixin of Report (see report.py for the helpers it uses)."""

    def cpu(self) -> None:
        path = self.raw / "cpu_tensors.json"
        if not self.begin_section(
                "## 3. CPU tensors: `torch.empty` + `del`, default CPU allocator vs torchmem", "cpu",
                path.exists(), (("CPU tensors ≥ 1 MiB", f"≥ {CPU_SPEEDUP_GOAL}× faster"),)):
            return
        d = json.loads(path.read_text())
        self.cpu_data = d
        rows_in = d["rows"]
        mode = d.get("mode", "processes")
        how = (f"one process per round ({d['rounds']} rounds); inside it, for each size, batches "
               "of the two allocators alternate (A B B A …, swapped with "
               "`torchmem.install/uninstall(\"cpu\")`), so the two sides of each ratio ran "
               "milliseconds apart" if mode == "interleaved" else
               f"one process per allocator and round, {d['rounds']} ABBA rounds")
        self.w(f"`cpu_tensor_benchmark.py`: {how}; {d['clock']} time of the thread; figures are "
               "medians over rounds, the speedup (default / torchmem, > 1: torchmem faster) is "
               "the median of the per-round ratios, with their range. The tensor is never "
               "touched. Default = c10's DefaultCPUAllocator (posix_memalign/free: glibc "
               "malloc); torchmem = `torchmem.install(\"cpu\")`. The 0-byte row is the floor: "
               "PyTorch's per-tensor cost without an allocator call. Absolute ns drift with the "
               "host's load between sizes (measured seconds apart); the ratios do not.")
        self.w()
        rows = []
        for r in rows_in:
            label = "0 B (floor)" if r["bytes"] == 0 else size_label(r["bytes"])
            rounds = r.get("round_speedups") or []
            spread = f"{min(rounds):.2f}–{max(rounds):.2f}" if rounds else "-"
            rows.append([label, fmt(r["default_ns"]), fmt(r["torchmem_ns"]),
                         f"{r['speedup_default_over_torchmem']:.2f}×", spread,
                         fmt(r["torchmem_ns"] - r["default_ns"])])
        self.table(["size", "default ns", "torchmem ns", "speedup", "rounds", "torchmem − default ns"],
                   rows)
        big = [r for r in rows_in if r["bytes"] >= CPU_GOAL_MIN_BYTES]
        if big:
            worst = min(big, key=lambda r: r["speedup_default_over_torchmem"])
            met = worst["speedup_default_over_torchmem"] >= CPU_SPEEDUP_GOAL
            n_met = sum(r["speedup_default_over_torchmem"] >= CPU_SPEEDUP_GOAL for r in big)
            detail = (f"{n_met} of {len(big)} sizes ≥ 1 MiB meet it; worst {size_label(worst['bytes'])}"
                      + ", best " + ", ".join(
                          f"{size_label(r['bytes'])} {r['speedup_default_over_torchmem']:.1f}×"
                          for r in big if r["speedup_default_over_torchmem"] >= CPU_SPEEDUP_GOAL))
            self.goal("CPU tensors ≥ 1 MiB faster than the default allocator",
                      f"≥ {CPU_SPEEDUP_GOAL}× on every size", f"min {worst['speedup_default_over_torchmem']:.2f}×",
                      met, detail)
            if not met:
                self.misses.append("cpu")
        self.plot_cpu(d)

    def analysis_cpu(self) -> None:
        if "cpu" in self.misses:
            d = getattr(self, "cpu_data", None)
            if d:
                rows = {r["bytes"]: r for r in d["rows"]}
                floor = rows.get(0)
                big = [r for r in d["rows"] if r["bytes"] >= CPU_GOAL_MIN_BYTES]
                slow = [r for r in big if r["speedup_default_over_torchmem"] < CPU_SPEEDUP_GOAL]
                text = ("**CPU tensors.** Missed on " + ", ".join(
                    f"{size_label(r['bytes'])} ({r['speedup_default_over_torchmem']:.2f}×)"
                    for r in slow) + ".")
                if floor is not None:
                    f_def = floor["default_ns"]
                    shares = ", ".join(
                        f"{size_label(r['bytes'])} {r['default_ns'] - f_def:.0f} ns" for r in slow)
                    need = min(r["default_ns"] for r in slow) / CPU_SPEEDUP_GOAL
                    text += (f" The floor (a 0-byte tensor: Python, dispatcher and TensorImpl, no "
                             f"allocator call) is {f_def:.0f} ns, and the default allocator adds "
                             f"only about {shares} to it: glibc serves these sizes from its heap "
                             "without a system call (its dynamic mmap threshold rises to the "
                             "size of a freed mmapped chunk, up to 32 MiB; strace shows no "
                             "mmap/munmap per tensor at 1 and 16 MiB and one pair per tensor at "
                             "64 MiB, on this machine). A 1.5× speedup would need torchmem's total under "
                             f"{need:.0f} ns" + (", below the floor itself" if need < f_def else "")
                             + ": unreachable for any allocator at these sizes, while at 64 MiB, "
                             "where glibc pays mmap + munmap (and page faults once the tensor is "
                             "touched), torchmem's cache wins by the factor shown. At the "
                             "missed sizes torchmem runs at "
                             f"{min(r['speedup_default_over_torchmem'] for r in slow):.2f}–"
                             f"{max(r['speedup_default_over_torchmem'] for r in slow):.2f}× of "
                             "glibc's speed (the last column of the table: its extra ns per "
                             "tensor).")
                self.w(text)
                self.w()
