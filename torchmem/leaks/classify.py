"""Classifying what a closed leak-check scope left behind (see ``torchmem.leaks.check``).

Survivors of the scope become findings: **allowed** (tag, ``expect_alive``, returned by a
decorated function, warm-up entry), **pending** (freed, waiting for other streams),
**cycle** (freed by the collection this module runs: only a reference cycle held them)
or **reachable** (still allocated after it: ``_owners.find_owners`` names the holders).
"""

from __future__ import annotations

import gc

from torchmem.runtime import devices as _devices
from torchmem.leaks import owners as _owners
from torchmem.stacks import frames as stack_frames
from torchmem.leaks.report import ALLOWED, CYCLE, PENDING, REACHABLE, Finding


class Classifier:
    """Turns the blocks a closed scope left behind into findings on the entry's report."""

    def __init__(self, check, entry, survivors: list[dict]):
        self.check = check
        self.entry = entry
        self.report = entry.report
        self.survivors = survivors
        self.engines: dict[str, object] = {}

    def run(self) -> None:
        candidates = []  # (device, block) still allocated at scope end and not allowed
        for group in self.survivors:
            try:
                device = _owners.device_key(group["device"])
                self._engine(device)
            except (RuntimeError, ValueError):
                continue  # an engine no PyTorch device maps to (a test engine): nothing to analyze
            if self.check.devices is not None and device not in self.check.devices:
                continue
            for block in group["pending"]:
                self._add(PENDING, device, block, note="freed, waiting for other streams' events")
            for block in group["allocated"]:
                if not self._still_allocated(device, block):
                    # Freed by another thread since the scope closed (not left behind), or a
                    # block of a standalone torchmem.Engine, which no device exposes.
                    continue
                reason = self._allowed_reason(device, block)
                if reason is not None:
                    self._add(ALLOWED, device, block, note=reason)
                else:
                    candidates.append((device, block))
        if not candidates:
            return
        freed: set = set()
        holders: dict = {}
        if self.check.gc_collect:
            freed, holders = self._collect_cycles(candidates)
            self.report.gc_collected = True
        reachable = [(device, block) for device, block in candidates if (device, block["address"]) not in freed]
        owners = {}
        if reachable:
            search = _owners.find_owners([(device, block["address"], block["size"]) for device, block in reachable])
            owners = search.owners
            self.report.owner_search_stopped_early = search.stopped_early
        note = None if self.check.gc_collect else "gc.collect() was not run (gc_collect=False): cycles count as reachable"
        for device, block in candidates:
            key = (device, block["address"])
            if key in freed:
                holder = holders.get(key)
                self._add(
                    CYCLE, device, block,
                    owners=(holder.owner,) if holder else (),
                    cycle_types=holder.cycle_types if holder else (),
                    cycle=holder.cycle if holder else None,
                )
            else:
                self._add(REACHABLE, device, block, owners=tuple(owners.get(key, ())), note=note)

    def _allowed_reason(self, device: str, block: dict) -> str | None:
        if self.report.warmup:
            return f"warm-up entry {self.report.entry} of {self.check.warmup}"
        if block["tag"] is not None and block["tag"] in self.check.allow_tags:
            return f"tag {block['tag']!r} is allowed"
        identity = (device, block["address"], block["sequence"])
        if identity in self.entry.expected:
            return "declared with torchmem.expect_alive"
        if identity in self.entry.returned:
            return "returned by the checked function"
        return None

    def _engine(self, device: str):
        engine = self.engines.get(device)
        if engine is None:
            engine = self.engines[device] = _devices.engine(device)
        return engine

    def _still_allocated(self, device: str, block: dict) -> bool:
        return still_allocated(self._engine(device), block)

    def _collect_cycles(self, candidates: list) -> tuple[set, dict]:
        """Collects garbage; returns the candidates it freed and, for those used by tensors
        in the garbage, the cycle that held them.

        The first collection runs with ``gc.DEBUG_SAVEALL``, so the garbage lands in
        ``gc.garbage`` instead of being freed and can be searched for the tensors and their
        cycles; the second frees it. (A program that set ``DEBUG_SAVEALL`` itself keeps
        its garbage: those blocks stay allocated and show as reachable from ``gc.garbage``.)
        """
        blocks = [(device, block["address"], block["size"]) for device, block in candidates]
        flags = gc.get_debug()
        kept_before = len(gc.garbage)  # the program's own uncollectable objects stay put
        gc.set_debug(flags | gc.DEBUG_SAVEALL)
        try:
            gc.collect()
        finally:
            gc.set_debug(flags)
        garbage = gc.garbage[kept_before:]
        del gc.garbage[kept_before:]
        if not garbage:
            return set(), {}  # nothing was unreachable: every candidate is still held
        try:
            holders = _owners.find_cycle_holders(blocks, garbage)
        finally:
            del garbage
        gc.collect()  # frees what the first pass only saved
        freed = {(device, block["address"]) for device, block in candidates if not self._still_allocated(device, block)}
        return freed, {key: holder for key, holder in holders.items() if key in freed}

    def _add(self, kind: str, device: str, block: dict, *, owners=(), cycle_types=(), cycle=None, note=None) -> None:
        self.report.findings.append(
            Finding(
                kind=kind,
                device=device,
                address=block["address"],
                size=block["size"],
                requested_size=block["requested_size"],
                tag=block["tag"],
                stream=block["stream"],
                frames=_frames(block["context"]),
                owners=tuple(owners),
                cycle_types=tuple(cycle_types),
                sequence=block["sequence"],
                cycle=cycle,
                note=note,
            )
        )


def still_allocated(engine, block: dict) -> bool:
    """True if ``block`` (a block dict from the engine) is still the live allocation at its
    address: the address is allocated and its sequence number unchanged. A freed address
    is often handed to the next allocation of that size at once, so the address alone
    proves nothing."""
    try:
        current = engine.block(block["address"])
    except ValueError:
        return False
    return current["sequence"] == block["sequence"]


def _frames(context: int) -> tuple:
    if not context:
        return ()
    return tuple(stack_frames.user_first(stack_frames.frames(context)))
