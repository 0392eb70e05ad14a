"""Classifying what a closed leak-check scope left behind (see ``torchmem.leaks.check``).

Survivors of the scope become findings: **allowed** (tag, ``expect_alive``, returned by a
decorated function, warm-up entry, a cache torch itself keeps (``torch_caches``), or held
only through an object the check was told to allow, such as a pytest test's arguments),
**pending** (freed, waiting for other streams), **cycle** (freed by the collection this
module runs: only a reference cycle held them; counted as leaked or not by
``torchmem.leaks.cycle_policy``) or **reachable** (still allocated after it:
``owners.find_owners`` names the holders).

Cost: a collection of the young generations first; for blocks still allocated after it that
no root certainly alive holds, the garbage above their tensors (the collector's algorithm on
those objects), and a collection of the whole heap only when that cannot decide them all
(``torchmem.leaks.collector``; the owner search looks for such roots first when the blocks'
tensors are young); the owner search names the holders of blocks that survive.
"""

from __future__ import annotations

import gc
import time
from dataclasses import replace

from torchmem.runtime import devices as _devices
from torchmem.runtime.tags import UNTAGGED
from torchmem.leaks import collector
from torchmem.leaks import cycle_policy
from torchmem.leaks import torch_caches
from torchmem.leaks import owners as _owners
from torchmem.leaks.tensors import BlockIndex, device_key
from torchmem.stacks import frames as stack_frames
from torchmem.leaks.report import ALLOWED, CYCLE, PENDING, REACHABLE, Finding
from torchmem.reports import categories as _categories


# Passes over the whole heap the owner search may make, before the exit's collection of the
# whole heap, to find blocks held by a root that is certainly alive (a module global's list
# or object: one pass). See Classifier._run.
PROBE_HEAP_PASSES = 1


class Classifier:
    """Turns the blocks a closed scope left behind into findings on the entry's report."""

    def __init__(self, check, entry, survivors: list[dict]):
        self.check = check
        self.entry = entry
        self.report = entry.report
        self.survivors = survivors
        self.engines: dict[str, object] = {}
        self.released_meanwhile: set = set()  # (device, address) freed by other threads, not by gc
        # Symbolized stacks by context id: the blocks one scope leaves mostly share a few
        # allocation stacks (a metric's states), and each block needs its stack twice.
        self._stacks: dict[int, list] = {}
        self._report_frames: dict[int, tuple] = {}
        self.young_keys: set = set()  # blocks used by tensors in the young generations at exit
        # While torchmem.track names a model or optimizer: {(device, data pointer): (category,
        # module, bytes)}, read before the collections free cycle-held graphs (their saved
        # activations are still registered then). None when nothing is tracked.
        self._storages: dict | None = None

    def run(self) -> None:
        started, started_cpu = time.perf_counter(), time.thread_time()
        try:
            self._run()
        finally:
            self.report.analysis_seconds = time.perf_counter() - started
            self.report.analysis_cpu_seconds = time.thread_time() - started_cpu

    def _run(self) -> None:
        if _categories.is_tracking():
            self._storages = _categories.classify_storages()
        candidates = []  # (device, block) still allocated at scope end and not allowed
        for group in self.survivors:
            try:
                device = device_key(group["device"])
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
        search = None  # an owner search already made for exactly the blocks found reachable
        remaining: list = []
        if self.check.gc_collect:
            # The young generations first (cheap); the whole heap for what is still
            # allocated then: garbage the collector already moved to its oldest generation
            # (the cycles of a long test or loop). See ``collector``.
            freed, holders, _ = self._collect_cycles(candidates, young=True)
            remaining = self._not_released([(device, block) for device, block in candidates
                                            if (device, block["address"]) not in freed])
            undecided = remaining
            decided_by_subset = None
            young_tensors = all(key in self.young_keys for key in self._keys(remaining))
            if remaining and not young_tensors:
                # Older tensors: the garbage above them first. A cycle the collector already
                # moved to its oldest generation (a long test's metric) is decided there,
                # without the whole heap's collection (``collector.garbage_above``).
                decided_by_subset = self._garbage_above(remaining)
                if decided_by_subset is not None:
                    undecided = []
            if undecided:
                # Exit order (for cost): the owner search before the whole heap's collection.
                # A block it finds held by a root that is certainly alive (a module global, a
                # test's argument) is no garbage's: that collection
                # (60 to 130 ms in a 280,000-object heap) could not free it, so it runs only
                # for the others. Each verdict is the one the collection-first order gives.
                # For young tensors first of all (made shortly before the exit, as a global's
                # list or a test's argument keeps them); for older ones after the garbage above
                # them did not decide them. The search gives up after one pass over the heap
                # (10 to 20 ms) if a block has no such root by then.
                search = self._find_owners(remaining, give_up_after=PROBE_HEAP_PASSES)
                if search.given_up:
                    search = None
                else:
                    undecided = [(device, block) for device, block in remaining
                                 if (device, block["address"]) not in search.live_rooted]
                    # Released by another thread during the search (a Gloo worker dropping
                    # its last reference): not left behind, as the collection would have found.
                    self.released_meanwhile |= {(device, block["address"]) for device, block in remaining
                                                if (device, block["address"]) in search.live_rooted
                                                and not self._still_allocated(device, block)}
            if undecided and young_tensors:
                decided_by_subset = self._garbage_above(undecided)
                if decided_by_subset is not None:
                    undecided = []
            if decided_by_subset is not None:
                late_freed, late_holders, _ = decided_by_subset
                freed |= late_freed
                holders.update(late_holders)
                search = None  # made for other blocks, if any
            if undecided:
                late_freed, late_holders, found_garbage = self._collect_cycles(undecided, young=False)
                freed |= late_freed
                holders.update(late_holders)
                if found_garbage:
                    search = None  # finalizers ran: the search below sees the heap as it is now
            self.report.gc_collected = True
        candidates = self._not_released(candidates)
        reachable = [(device, block) for device, block in candidates if (device, block["address"]) not in freed]
        if search is not None and len(reachable) != len(remaining):
            search = None  # made for other blocks: searched again for exactly these, as before
        if reachable and search is None:
            search = self._find_owners(reachable)
        if search is not None:
            self.report.owner_search_stopped_early = search.stopped_early
        note = None if self.check.gc_collect else "gc.collect() was not run (gc_collect=False): cycles count as reachable"
        cycle_findings = []
        for device, block in candidates:
            key = (device, block["address"])
            if key in self.released_meanwhile:
                continue  # released by another thread during a collection: not left behind
            if key in freed:
                holder = holders.get(key)
                cycle_findings.append((len(self.report.findings), holder))
                self._add(
                    CYCLE, device, block,
                    owners=(holder.owner,) if holder else (),
                    cycle_types=holder.cycle_types if holder else (),
                    cycle=holder.cycle if holder else None,
                )
                continue
            owners = tuple(search.owners.get(key, ())) if search else ()
            allowed = search.allowed.get(key) if search else None
            if allowed is not None:
                self._add(ALLOWED, device, block, owners=owners, note=allowed)
            else:
                self._add(REACHABLE, device, block, owners=owners, note=note or (search.notes.get(key) if search else None))
        self._judge_cycles(cycle_findings)

    @staticmethod
    def _keys(candidates: list) -> list:
        return [(device, block["address"]) for device, block in candidates]

    def _not_released(self, candidates: list) -> list:
        """``candidates`` less those another thread released during a collection."""
        return [(device, block) for device, block in candidates
                if (device, block["address"]) not in self.released_meanwhile]

    def _find_owners(self, candidates: list, give_up_after: int | None = None):
        return _owners.find_owners(
            [(device, block["address"], block["size"]) for device, block in candidates],
            allowed_roots=self.check.allowed_roots + self.entry.allowed_roots,
            give_up_after=give_up_after,
        )

    def _judge_cycles(self, cycle_findings: list) -> None:
        """Applies the cycle policy to the cycle-held findings of this entry."""
        held = []
        for index, holder in cycle_findings:
            finding = self.report.findings[index]
            holder_type = holder.holder_type if holder else ""
            # What was dropped together (one wrapper above many metric copies) counts once;
            # a block whose holder is unknown is not counted (cycle_policy.judge).
            tops = holder.dropped_with if holder and holder.dropped_with else frozenset({("unknown", index)})
            held.append((index, (finding.context, holder_type), tops))
        verdicts = cycle_policy.judge(held, policy=self.check.cycles, repeats=self.check.cycle_repeats)
        for index, verdict in verdicts.items():
            finding = self.report.findings[index]
            self.report.findings[index] = replace(finding, counted=verdict.counted, note=verdict.note)

    def _allowed_reason(self, device: str, block: dict) -> str | None:
        if self.report.warmup:
            return f"warm-up entry {self.report.entry} of {self.check.warmup}"
        tag = block["tag"]
        if tag in self.check.allow_tags or (tag is None and UNTAGGED in self.check.allow_tags):
            return f"tag {tag if tag is not None else UNTAGGED!r} is allowed"
        identity = (device, block["address"], block["sequence"])
        if identity in self.entry.expected:
            return "declared with torchmem.expect_alive"
        if identity in self.entry.returned:
            return "returned by the checked function"
        if identity in self.entry.yielded:
            return "yielded by the checked generator"
        if block["context"]:
            return torch_caches.reason(self._stack(block["context"]), block["requested_size"])
        return None

    def _stack(self, context: int) -> list:
        """The stack recorded for ``context``, innermost first, symbolized once per run."""
        stack = self._stacks.get(context)
        if stack is None:
            stack = self._stacks[context] = stack_frames.frames(context)
        return stack

    def _frames(self, context: int) -> tuple:
        """The stack of ``context`` as a report shows it (user's frames first)."""
        if not context:
            return ()
        shown = self._report_frames.get(context)
        if shown is None:
            shown = self._report_frames[context] = tuple(stack_frames.user_first(self._stack(context)))
        return shown

    def _engine(self, device: str):
        engine = self.engines.get(device)
        if engine is None:
            engine = self.engines[device] = _devices.engine(device)
        return engine

    def _still_allocated(self, device: str, block: dict) -> bool:
        return still_allocated(self._engine(device), block)

    def _collect_cycles(self, candidates: list, *, young: bool) -> tuple[set, dict, bool]:
        """Finds the garbage of the young generations (``young``) or of the whole heap;
        returns the candidates it holds, for those used by tensors in the garbage the cycle
        that held them, and whether there was any garbage.

        Young garbage is found without collecting (``collector.young_garbage``), inspected,
        then freed by ``gc.collect(1)``: a candidate counts as cycle-held when that freed it.
        The whole heap's is found by a saving collection and inspected; a candidate counts
        as cycle-held when the garbage holds it (a cycle above its tensor). That garbage is
        left to the collector's next full pass, as without the check (it is in the oldest
        generation already): a second pass over the whole heap would double the exit's cost.
        (A program that set ``gc.DEBUG_SAVEALL`` itself keeps its garbage: those blocks stay
        allocated and show as reachable from ``gc.garbage``.)
        """
        blocks = [(device, block["address"], block["size"]) for device, block in candidates]
        if young:
            self.young_keys = collector.young_tensor_blocks(BlockIndex(blocks))
        garbage = collector.young_garbage() if young else collector.collect_saving_garbage()
        if garbage is None:  # too many young objects to sort in Python: the whole heap's pass
            return self._collect_cycles(candidates, young=False)
        # The garbage is still alive here, so a candidate already gone was released by
        # something else (a Gloo worker dropping its last reference to a collective's tensor
        # just after the collective returned), not by the garbage collector: not left behind.
        released = {(device, block["address"]) for device, block in candidates
                    if not self._still_allocated(device, block)}
        self.released_meanwhile |= released
        if not garbage:
            return set(), {}, False  # nothing was unreachable: every candidate left is still held
        try:
            holders = _owners.find_cycle_holders(blocks, garbage)
        finally:
            del garbage
        if not young:
            held = set(holders) - released
            return held, {key: holder for key, holder in holders.items() if key in held}, True
        # Frees what was only found. What another thread releases meanwhile is not the
        # collector's doing: the blocks gone when the collection starts (after the other
        # callbacks, a Gloo worker's release among them) are set apart.
        at_start: set = set()

        def note_released(phase, info):
            if phase == "start" and not at_start:
                at_start.add(None)
                at_start.update((device, block["address"]) for device, block in candidates
                                if not self._still_allocated(device, block))

        gc.callbacks.append(note_released)
        try:
            gc.collect(collector.YOUNG)
        finally:
            gc.callbacks.remove(note_released)
        at_start.discard(None)
        released |= at_start
        self.released_meanwhile |= at_start
        freed = {(device, block["address"]) for device, block in candidates
                 if not self._still_allocated(device, block)} - released
        return freed, {key: holder for key, holder in holders.items() if key in freed}, True

    def _garbage_above(self, candidates: list) -> tuple[set, dict, bool] | None:
        """``_collect_cycles(candidates, young=False)``'s answer without the whole heap's
        collection, when the garbage above the candidates' tensors decides every candidate
        (``collector.garbage_above``): each has tensors, all of them garbage, and the cycle
        holding it is found in that garbage. The collection's own garbage holds the same
        objects above the tensors in the same order, so the holders found are the same.
        None otherwise: the caller collects the whole heap, as without this."""
        keys = set(self._keys(candidates))
        blocks = [(device, block["address"], block["size"]) for device, block in candidates]
        found = collector.garbage_above(BlockIndex(blocks))
        if found is None or not keys <= found.decided:
            return None
        try:
            holders = _owners.find_cycle_holders(blocks, found.garbage)
        finally:
            found.garbage = None
        if not keys <= set(holders):
            return None
        released = {(device, block["address"]) for device, block in candidates
                    if not self._still_allocated(device, block)}
        self.released_meanwhile |= released
        held = keys - released
        self.report.subset_collection = (found.passes, found.members)
        return held, {key: holder for key, holder in holders.items() if key in held}, True

    def _add(self, kind: str, device: str, block: dict, *, owners=(), cycle_types=(), cycle=None, note=None) -> None:
        category = module = None
        if self._storages is not None:
            # The lookup GrowthMonitor and captures use: a block is its storage's allocation.
            category, module, _ = self._storages.get((device, block["address"]), (_categories.OTHER, None, 0))
        self.report.findings.append(
            Finding(
                kind=kind,
                device=device,
                address=block["address"],
                size=block["size"],
                requested_size=block["requested_size"],
                tag=block["tag"],
                stream=block["stream"],
                frames=self._frames(block["context"]),
                owners=tuple(owners),
                cycle_types=tuple(cycle_types),
                sequence=block["sequence"],
                cycle=cycle,
                note=note,
                context=block["context"],
                category=category,
                module=module,
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
