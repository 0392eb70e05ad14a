"""What one rank sends for the job report, and how long bringing every rank's report together takes.

    # from the repository root (torchmem is used in place: PYTHONPATH=.)
    PYTHONPATH=. python benchmarks/distributed_gather.py                 # sizes, then world sizes 2, 4, 8
    PYTHONPATH=. python benchmarks/distributed_gather.py --worlds 2 4 --repeats 5 --json out.json

Part 1, size (this process). The bytes of one encoded ``RankReport`` (compact JSON, zlib; what
``gather``/``all_gather`` and ``python -m torchmem run``'s store carry) with T tags and F leak
groups, all real: T tags that allocated through torchmem, and F tensors leaked from F different
lines of a generated module, found by a real ``leak_check`` (each group renders with its holder and
allocation line). A least-squares fit gives bytes = a + b*T + c*F. The collective
``leak_check``'s exchange (no table, only the leak part) is measured the same way.

Part 2, time (spawned ranks over Gloo, CPU, on this machine). For each world size, every rank
holds T=16 tags, and either no leak (the usual case) or F=5 leak groups; after a barrier, rank 0
times (median over ``--repeats``):

* ``gather()``: all_gather_object of sizes + gather of the payloads + decoding them on rank 0;
* ``all_gather()``: every rank receives and decodes every payload;
* the exit of a collective ``leak_check`` that found nothing (the local check + one all_gather);
* the launcher-store path of ``run``: each rank sets its report in a ``TCPStore``, rank 0 waits
  for all and reads them with one ``multi_get``, then decodes.

World sizes above the core count (2 here) oversubscribe the machine: those times include the
scheduler's, and are an upper bound of the per-rank cost. Prints a Markdown table and the
projection to 1,024 ranks (see ``project``); never asserts on time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

import torch

import torchmem
import torchmem.distributed as tmd
from torchmem.distributed import payload as _payload

TAG_NAME = "model.layers.{:02d}.forward"  # a realistic tag name (~24 characters)
LEAK_LINE = "    KEPT.append(torch.zeros(256))  # a cache nobody clears, site {}\n"


def _leak_module(directory: str, groups: int) -> str:
    """A module with ``groups`` functions, each leaking from its own line."""
    path = os.path.join(directory, "leaky_sites.py")
    with open(path, "w") as file:
        file.write("import torch\n\nKEPT = []\n\n")
        for index in range(groups):
            file.write(f"\ndef site_{index}():\n")
            file.write(LEAK_LINE.format(index))
    return path


def _import(path: str):
    spec = importlib.util.spec_from_file_location("leaky_sites", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["leaky_sites"] = module
    spec.loader.exec_module(module)
    return module


def _make_tags(count: int) -> list:
    kept = []
    for index in range(count):
        with torchmem.tag(TAG_NAME.format(index)):
            kept.append(torch.zeros(64 + index))
    return kept


def _leak_report(module, groups: int):
    with torchmem.leak_check(raise_on_leak=False) as report:
        for index in range(groups):
            getattr(module, f"site_{index}")()
    return report


# --- part 1 -----------------------------------------------------------------------------------


def measure_sizes(directory: str) -> dict:
    tags_grid, findings_grid = (0, 8, 32, 128), (0, 1, 5, 20)
    kept = _make_tags(max(tags_grid))
    module = _import(_leak_module(directory, max(findings_grid)))
    report = _leak_report(module, max(findings_grid))
    rows = []
    for tags in tags_grid:
        for findings in findings_grid:
            rank_report = _payload.collect(rank=0, world_size=1, devices="cpu", leaks=report,
                                           max_tags=tags, max_findings=findings)
            if findings == 0:
                rank_report.leaks = None  # no leak part at all: the usual gather() without leaks
            data = rank_report.to_dict()
            rows.append({
                "tags": tags, "findings": findings,
                "json_bytes": len(json.dumps(data, separators=(",", ":"))),
                "encoded_bytes": len(_payload.encode(data)),
            })
    # The collective leak_check's exchange: options, versions and the compact leak part only.
    check_rows = []
    for findings in findings_grid:
        leaks = _payload.compact_leaks(report, max(findings, 1)) if findings else _payload.compact_leaks(
            _leak_report(module, 0))
        outcome = {"version": torchmem.__version__, "options": {}, "entry": 1, "rank": 0, "global_rank": 0,
                   "error": None, "leaks": leaks}
        check_rows.append({"findings": findings, "encoded_bytes": len(_payload.encode(outcome)),
                           "decode_seconds": decode_seconds(_payload.encode(outcome), 500)})
    typical = _payload.encode(_payload.collect(rank=0, world_size=1, devices="cpu", leaks=report, max_tags=16,
                                               max_findings=5).to_dict())
    del kept
    module.KEPT.clear()
    return {"payload": rows, "leak_check_exchange": check_rows, "fit": _fit(rows),
            "decode_seconds_16_tags_5_groups": decode_seconds(typical), "typical_bytes": len(typical)}


def _fit(rows: list) -> dict:
    """Least squares: bytes = a + b*tags + d*[a leak part] + c*findings, for the encoded payload
    and for its JSON before compression (the bound for tag names that do not compress)."""
    import numpy

    matrix = numpy.array([[1.0, row["tags"], 1.0 if row["findings"] else 0.0, row["findings"]] for row in rows])
    out = {}
    for key in ("encoded_bytes", "json_bytes"):
        target = numpy.array([row[key] for row in rows], dtype=float)
        (a, b, d, c), *_ = numpy.linalg.lstsq(matrix, target, rcond=None)
        out[key] = {"base": round(a), "per_tag": round(b, 1), "leak_part": round(d), "per_finding_group": round(c, 1)}
    return out


def decode_seconds(data: bytes, rounds: int = 2000) -> float:
    """Median seconds to decode one payload (what the receiving rank does per rank)."""
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(rounds):
            _payload.decode(data)
        samples.append((time.perf_counter() - start) / rounds)
    return statistics.median(samples)


# --- part 2 (in each rank) --------------------------------------------------------------------


def rank_timings(rank: int, world_size: int, directory: str, findings: int, repeats: int) -> dict | None:
    import torch.distributed as dist
    from datetime import timedelta

    kept = _make_tags(16)
    module = _import(os.path.join(directory, "leaky_sites.py"))  # written by measure_sizes
    report = _leak_report(module, findings)
    times = {"gather": [], "all_gather": [], "leak_check_exit": [], "store": []}

    # The store of `run`: rank 0 hosts it, everybody else connects (port sent over the group).
    host = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False) if rank == 0 else None
    port = [host.port if host else None]
    dist.broadcast_object_list(port, src=0)
    store = host or dist.TCPStore("127.0.0.1", port[0], None, False, timedelta(seconds=60), wait_for_workers=False)
    mine = _payload.encode(tmd.local_report(rank, world_size, leaks=report, max_findings=max(findings, 1)).to_dict())

    for repeat in range(repeats + 1):  # the first round warms up and is not counted
        dist.barrier()
        start = time.perf_counter()
        tmd.gather(leaks=report, max_findings=max(findings, 1))
        gathered = time.perf_counter() - start

        dist.barrier()
        start = time.perf_counter()
        tmd.all_gather(leaks=report, max_findings=max(findings, 1))
        all_gathered = time.perf_counter() - start

        dist.barrier()
        start = time.perf_counter()
        with tmd.leak_check():
            pass
        check_exit = time.perf_counter() - start

        dist.barrier()
        start = time.perf_counter()
        store.set(f"report/{repeat}/{rank}", mine)
        if rank == 0:
            keys = [f"report/{repeat}/{other}" for other in range(world_size)]
            store.wait(keys, timedelta(seconds=60))
            for value in store.multi_get(keys):
                _payload.decode(value)
        stored = time.perf_counter() - start
        if repeat:
            times["gather"].append(gathered)
            times["all_gather"].append(all_gathered)
            times["leak_check_exit"].append(check_exit)
            times["store"].append(stored)
    # One small message there and back between ranks 0 and 1: the transport's latency here.
    ping = torch.zeros(1)
    round_trips = []
    for _ in range(200):
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(ping, 1)
            dist.recv(ping, 1)
        elif rank == 1:
            dist.recv(ping, 0)
            dist.send(ping, 0)
        round_trips.append(time.perf_counter() - start)
    dist.barrier()
    del kept
    module.KEPT.clear()
    if rank != 0:
        return None
    return ({name: statistics.median(values) for name, values in times.items()}
            | {f"{name}_min": min(values) for name, values in times.items()}
            | {"payload_bytes": len(mine), "one_way_latency": statistics.median(round_trips) / 2,
               "one_way_latency_min": min(round_trips) / 2})


def measure_times(worlds: list[int], repeats: int, directory: str) -> list[dict]:
    rows = []
    for findings in (0, 5):
        for world in worlds:
            results = tmd.spawn(rank_timings, world_size=world, args=(directory, findings, repeats), check=False,
                                timeout=600)
            rows.append({"world_size": world, "findings": findings, **results[0]})
    return rows


def project(sizes: dict, times: list[dict], ranks: int = 1024, latency: float | None = None,
            bandwidth: float = 1e9) -> dict:
    """A model of rank 0's time at ``ranks``, with this machine's measured constants.

    ``gather_object`` on Gloo is an all-gather of the payload sizes (a ring: ranks - 1 steps of one
    message each) and then a gather (rank 0 receives ranks - 1 payloads); rank 0 then decodes each.
    So t = 2 (ranks - 1) L + ranks S / B + ranks D, with L the one-way latency of a small message
    (the fastest round trip between two ranks here, halved, unless given), S the payload, B the bandwidth into rank 0,
    D the decode time of one payload. ``all_gather`` and the collective leak check's exit are a
    ring all-gather of sizes and one of payloads: 2 (ranks - 1) L + ranks S / B, plus decoding all
    (all_gather) or the ranks' small outcomes (leak check). The store path of ``run``: every rank's one ``set`` is
    handled by the store's single server (~L each, serialized), then one ``multi_get`` and the
    decoding. These are models: a real cluster adds its topology and switch latency."""
    measured = [row for row in times if row["world_size"] == 2 and "one_way_latency" in row]
    # The fastest of 200 round trips: the transport's own latency, least disturbed by other work.
    latency = latency if latency is not None else statistics.median(row["one_way_latency_min"] for row in measured)
    decode = sizes["decode_seconds_16_tags_5_groups"]
    size = sizes["typical_bytes"]
    clean_outcome = sizes["leak_check_exchange"][0]["encoded_bytes"]
    ring = 2 * (ranks - 1) * latency
    return {
        "assumed": {"latency_us": latency * 1e6, "bandwidth_GBps": bandwidth / 1e9, "decode_us": decode * 1e6,
                    "payload_bytes": size, "clean_leak_check_bytes": clean_outcome, "ranks": ranks},
        "gather_ms": (ring + ranks * size / bandwidth + ranks * decode) * 1e3,
        "all_gather_ms": (ring + ranks * size / bandwidth + ranks * decode) * 1e3,
        "leak_check_exit_ms": (ring + ranks * clean_outcome / bandwidth
                               + ranks * sizes["leak_check_exchange"][0]["decode_seconds"]) * 1e3,
        "store_ms": (ranks * latency + ranks * size / bandwidth + ranks * decode) * 1e3,
        "rank0_receives_bytes": ranks * size,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    torchmem.install("cpu")
    with tempfile.TemporaryDirectory(prefix="torchmem-bench-") as directory:
        sizes = measure_sizes(directory)
        times = measure_times(args.worlds, args.repeats, directory)
    projection = project(sizes, times) if any(row["world_size"] == 2 for row in times) else None

    print("## Bytes one rank sends (encoded RankReport)\n")
    print("| tags \\ leak groups | " + " | ".join(str(f) for f in (0, 1, 5, 20)) + " |")
    print("|---|" + "---:|" * 4)
    for tags in (0, 8, 32, 128):
        cells = [f"{row['encoded_bytes']:,}" for row in sizes["payload"] if row["tags"] == tags]
        print(f"| {tags} | " + " | ".join(cells) + " |")
    for key, label in (("encoded_bytes", "encoded"), ("json_bytes", "JSON before compression")):
        fit = sizes["fit"][key]
        print(f"fit ({label}): {fit['base']} B + {fit['per_tag']} B per tag + {fit['leak_part']} B for a leak "
              f"report + {fit['per_finding_group']} B per leak group")
    print("collective leak_check exchange: " + ", ".join(
        f"{row['findings']} groups {row['encoded_bytes']:,} B" for row in sizes["leak_check_exchange"]))
    print(f"decoding one payload ({sizes['typical_bytes']} B: 16 tags, 5 leak groups): "
          f"{sizes['decode_seconds_16_tags_5_groups'] * 1e6:.1f} us")
    print("\n## Time on rank 0 (ms), Gloo on this machine\n")
    print("median (fastest) of the rounds; the fastest is the least disturbed by other work\n")
    print("| ranks | leak groups | payload | gather | all_gather | leak_check exit | store (run) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in times:
        cells = " | ".join(f"{row[name] * 1e3:.2f} ({row[name + '_min'] * 1e3:.2f})"
                           for name in ("gather", "all_gather", "leak_check_exit", "store"))
        print(f"| {row['world_size']} | {row['findings']} | {row['payload_bytes']:,} B | {cells} |")
    if projection is not None:
        assumed = projection["assumed"]
        print(f"\n## Model at {assumed['ranks']:,} ranks (latency {assumed['latency_us']:.0f} us: fastest round trip here / 2, "
              f"{assumed['bandwidth_GBps']:g} GB/s into rank 0, decode {assumed['decode_us']:.0f} us)\n")
        for name in ("gather_ms", "all_gather_ms", "leak_check_exit_ms", "store_ms"):
            print(f"- {name[:-3]}: {projection[name]:.0f} ms")
        print(f"- rank 0 receives {projection['rank0_receives_bytes'] / 1e6:.2f} MB")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"sizes": sizes, "times": times, "projection": projection,
                       "load_average": os.getloadavg()}, file, indent=2)
    print(f"\nload average at the end: {', '.join(f'{value:.2f}' for value in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
