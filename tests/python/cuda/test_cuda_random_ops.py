"""Random sequences of PyTorch memory operations: PyTorch's stats equal a recount.

After each burst of operations (allocations of every size class, frees, frees of blocks
still used by another stream, empty_cache, private pools, peak resets), every current
value of ``torch.cuda.memory_stats()`` must equal what the blocks of
``torch.cuda.memory_snapshot()`` add up to, and every counter must be consistent
(allocated - freed is the change of current since the counters started, current <= peak). Seeded: the same sequence every run.
"""

import random

import pytest
import torch

import torchmem

POOLS = {"small": "small_pool", "large": "large_pool"}


TORCH = torch.torch_version.TorchVersion(torch.__version__.split("+")[0])


def recount(snapshot: list[dict]) -> dict[str, int]:
    """The current value of each stat, from the segments and blocks alone."""
    counts: dict[str, int] = {}

    def add(name: str, pool: str, amount: int) -> None:
        for key in (f"{name}.all.current", f"{name}.{POOLS[pool]}.current"):
            counts[key] = counts.get(key, 0) + amount

    for name in ("segment", "reserved_bytes", "allocation", "allocated_bytes", "active",
                 "active_bytes", "requested_bytes", "inactive_split", "inactive_split_bytes"):
        for pool in POOLS:
            add(name, pool, 0)
    for segment in snapshot:
        pool = segment["segment_type"]
        # PyTorch counts reserved bytes per private pool from 2.13.
        if tuple(segment["segment_pool_id"]) != (0, 0) and TORCH >= (2, 13):
            first, second = segment["segment_pool_id"]
            for kind in ("all", POOLS[pool]):
                key = f"reserved_bytes_by_private_pools.{first}_{second}.{kind}.current"
                counts[key] = counts.get(key, 0) + segment["total_size"]
        add("segment", pool, 1)
        add("reserved_bytes", pool, segment["total_size"])
        split = len(segment["blocks"]) > 1
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                add("allocation", pool, 1)
                add("allocated_bytes", pool, block["size"])
            if block["state"] in ("active_allocated", "active_pending_free"):
                add("active", pool, 1)
                add("active_bytes", pool, block["size"])
                add("requested_bytes", pool, block["requested_size"])
            elif split:
                add("inactive_split", pool, 1)
                add("inactive_split_bytes", pool, block["size"])
    return counts


def currents() -> dict[str, int]:
    stats = torch.cuda.memory_stats(0)
    return {key[: -len(".current")]: value for key, value in stats.items() if key.endswith(".current")}


def reset_counters() -> dict[str, int]:
    """Zeroes the running totals; returns the current values they now count from."""
    torch.cuda.reset_accumulated_memory_stats()
    return currents()


def check(device: int, counted_from: dict[str, int]) -> None:
    stats = torch.cuda.memory_stats(device)
    assert stats == torchmem.memory_stats(f"cuda:{device}")
    expected = recount(torch.cuda.memory_snapshot())
    assert {key: stats[key] for key in expected} == expected
    for key, value in stats.items():
        if key.endswith(".current"):
            stem = key[: -len(".current")]
            assert stats[stem + ".peak"] >= value, stem
            running = stats[stem + ".allocated"] - stats[stem + ".freed"]
            assert running == value - counted_from.get(stem, 0), stem
    assert stats["oversize_allocations.current"] == stats["oversize_segments.current"] == 0


SIZES = [1, 512, 4000, 100_000, 1 << 20, (1 << 20) + 1, 3 << 20, 11 << 20, 25 << 20]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_operations_keep_every_stat_equal_to_a_recount(sim, seed):
    rng = random.Random(seed)
    sim.set_event_mode("manual")  # blocks used by another stream stay pending until completed
    side = torch.cuda.Stream()
    pool = torch.cuda.MemPool()
    live: list[torch.Tensor] = []
    raw: list[int] = []
    counted_from = reset_counters()
    for step in range(240):
        op = rng.random()
        if op < 0.45:
            size = rng.choice(SIZES) + rng.randrange(0, 700)
            if rng.random() < 0.2:
                with torch.cuda.use_mem_pool(pool):
                    live.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
            else:
                live.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        elif op < 0.50:
            raw.append(torch.cuda.caching_allocator_alloc(rng.choice(SIZES), stream=side))
        elif op < 0.55 and raw:
            torch.cuda.caching_allocator_delete(raw.pop(rng.randrange(len(raw))))
        elif op < 0.85 and live:
            tensor = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.3:
                tensor.record_stream(side)  # freed now, reusable once `side` is done
            del tensor
        elif op < 0.90:
            sim.complete_stream(side)
        elif op < 0.94:
            torch.cuda.empty_cache()
        elif op < 0.97:
            torch.cuda.reset_peak_memory_stats()
        else:
            counted_from = reset_counters()
        if step % 8 == 7:
            check(0, counted_from)
    del live
    for ptr in raw:
        torch.cuda.caching_allocator_delete(ptr)
    sim.complete_all()
    del pool
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == 0
