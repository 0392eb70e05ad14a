#!/usr/bin/env python3
"""Writes the seed corpus of the engine fuzzer (tests/fuzz/corpus/seed-*).

Each seed is a small program in the fuzzer's input format (see Op and the
Do* methods in engine_fuzzer.cc): one opcode byte, then little-endian
arguments. Seeds start libFuzzer at the interesting places (pool and segment
boundaries, the out-of-memory ladder, streams and events, faults of every
backend call, tags, scopes, reports) instead of making it discover the
format. Crash regressions (regression-*) are added by hand and never
rewritten here.

Usage: tests/fuzz/make_corpus.py   (rewrites the seed-* files)
"""
import pathlib
import struct

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"

# Opcodes, in the order of enum Op.
(ALLOCATE, FREE, FREE_INVALID, RECORD_STREAM, COMPLETE_STREAM, PROCESS_EVENTS, EMPTY_CACHE,
 TAG, SCOPE, SET_LIMIT, SET_FRACTION, SET_CAPACITY, FAULT, FORBID, TRACE_CAPACITY,
 REPORT, POOL, CAPTURE, CHECKPOINT, CONFIG) = range(20)

# Indexes into kBoundaries.
BOUNDARIES = ["1", "511", "512", "513", "4096", "1M-512", "1M", "1M+1", "2M-512", "2M", "2M+1",
              "10M-512", "10M", "10M+1", "20M", "20M+1", "32M-512", "32M", "32M+1", "1G",
              "max-1", "max", "max+1", "SIZE_MAX"]
# Backend calls, in the order of kAllBackendCalls.
CALLS = ["AllocateSegment", "ReleaseSegment", "Capacity", "CheckSegmentAllocationAllowed",
         "RecordEvent", "QueryEvent", "SynchronizeEvent", "VirtualMemoryPageSize",
         "ReserveAddressRange", "ReleaseAddressRange", "CreatePhysicalPage",
         "ReleasePhysicalPage", "MapPage", "SetAccess", "UnmapPages"]
INTERNAL, RESOURCE_EXHAUSTED, UNAVAILABLE = 13, 8, 14  # absl::StatusCode values
STREAMS = 4


class Program:
    def __init__(self):
        self.out = bytearray()
        self.live = 0

    def u8(self, v):
        self.out += struct.pack("<B", v & 0xFF)

    def u16(self, v):
        self.out += struct.pack("<H", v & 0xFFFF)

    def u32(self, v):
        self.out += struct.pack("<I", v & 0xFFFFFFFF)

    def u64(self, v):
        self.out += struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)

    # --- allocation --------------------------------------------------------
    def alloc_small(self, size, stream=0):  # kind 2: any size up to 1 MiB
        self.u8(ALLOCATE), self.u8(2), self.u32(size), self.u8(stream)
        self.live += 1
        return self

    def alloc_medium(self, size, stream=0):  # kind 4: up to 64 MiB
        self.u8(ALLOCATE), self.u8(4), self.u32(size), self.u8(stream)
        self.live += 1
        return self

    def alloc_boundary(self, name, delta=0, stream=0):  # kind 3
        self.u8(ALLOCATE), self.u8(3), self.u8(BOUNDARIES.index(name)), self.u8(delta)
        self.u8(stream)
        self.live += 1
        return self

    def alloc_raw(self, size, stream=0):  # kind 5: any 64-bit size
        self.u8(ALLOCATE), self.u8(5), self.u64(size), self.u8(stream)
        return self

    def alloc_zero(self):
        self.u8(ALLOCATE), self.u8(0), self.u8(0)
        return self

    def alloc_near_capacity(self, below):  # kind 6
        self.u8(ALLOCATE), self.u8(6), self.u32(below), self.u8(0)
        self.live += 1
        return self

    def alloc_power_of_two(self, shift, adjust=1):  # kind 7: 2^shift - 1 + adjust
        self.u8(ALLOCATE), self.u8(7), self.u8(shift), self.u8(adjust), self.u8(0)
        self.live += 1
        return self

    # --- frees -------------------------------------------------------------
    def free(self, index=0, mode=0):  # 0: Free, 1: FreeSized, 2: wrong size
        self.u8(FREE), self.u16(index), self.u8(mode)
        if mode == 2:
            self.u8(7)
        elif self.live:
            self.live -= 1
        return self

    def free_interior(self, index=0, offset=100):
        self.u8(FREE_INVALID), self.u8(0), self.u16(index), self.u32(offset)
        return self

    def free_again(self, index=0):  # a pointer handed out before (double free)
        self.u8(FREE_INVALID), self.u8(1), self.u16(index)
        return self

    def free_unknown(self, address):
        self.u8(FREE_INVALID), self.u8(2), self.u64(address)
        return self

    # --- streams and events ------------------------------------------------
    def record_stream(self, index, stream):
        self.u8(RECORD_STREAM), self.u16(index), self.u8(stream)
        return self

    def complete_all(self):
        self.u8(COMPLETE_STREAM), self.u8(0)
        return self

    def toggle_auto_complete(self):
        self.u8(COMPLETE_STREAM), self.u8(1)
        return self

    def complete_stream(self, stream):
        self.u8(COMPLETE_STREAM), self.u8(2), self.u8(stream)
        return self

    def process_events(self):
        self.u8(PROCESS_EVENTS)
        return self

    def empty_cache(self):
        self.u8(EMPTY_CACHE)
        return self

    # --- attribution -------------------------------------------------------
    def push_tag(self, tag):
        self.u8(TAG), self.u8(0), self.u8(tag)
        return self

    def pop_tag(self):
        self.u8(TAG), self.u8(2), self.u8(0)
        return self

    def pop_wrong_tag(self, tag):
        self.u8(TAG), self.u8(3), self.u8(tag)
        return self

    def push_bogus_tag(self, which=1):
        self.u8(TAG), self.u8(4), self.u8(0), self.u8(which)
        return self

    def open_scope(self):
        self.u8(SCOPE), self.u8(0)
        return self

    def close_scope(self):
        self.u8(SCOPE), self.u8(2)
        return self

    def close_scope_out_of_order(self, index=0):
        self.u8(SCOPE), self.u8(3), self.u8(index)
        return self

    def close_unknown_scope(self, scope):
        self.u8(SCOPE), self.u8(3), self.u64(scope)
        return self

    # --- limits and capacity -----------------------------------------------
    def set_limit_boundary(self, name):
        self.u8(SET_LIMIT), self.u8(2), self.u8(BOUNDARIES.index(name))
        return self

    def set_limit(self, value, shift=0):
        self.u8(SET_LIMIT), self.u8(1), self.u32(value), self.u8(shift)
        return self

    def remove_limit(self):
        self.u8(SET_LIMIT), self.u8(0)
        return self

    def set_fraction(self, byte):  # byte / 255
        self.u8(SET_FRACTION), self.u8(0), self.u8(byte)
        return self

    def set_fraction_double(self, value):
        self.u8(SET_FRACTION), self.u8(2), self.out.extend(struct.pack("<d", value))
        return self

    def set_capacity(self, value, shift=0):
        self.u8(SET_CAPACITY), self.u8(0), self.u32(value), self.u8(shift)
        return self

    def set_capacity_raw(self, value):
        self.u8(SET_CAPACITY), self.u8(2), self.u64(value)
        return self

    # --- faults ------------------------------------------------------------
    def fault(self, call, pattern, code=INTERNAL, n=0, seed=0):
        # pattern: 0 once, 1 next n%8+1, 2 after n%8 successes, 3 always,
        # 4 with probability (n+1)/257, 5 clear this call, 6 clear all
        self.u8(FAULT), self.u8(CALLS.index(call)), self.u8(pattern), self.u8(code - 1)
        self.u8(n)
        if pattern == 4:
            self.u16(seed)
        return self

    def clear_faults(self):
        return self.fault("AllocateSegment", 6)

    def forbid(self, on=True):
        self.u8(FORBID), self.u8(0 if on else 1)
        return self

    # --- reports -----------------------------------------------------------
    def trace_capacity(self, entries):
        self.u8(TRACE_CAPACITY), self.u16(entries)
        return self

    def report(self, kind, index=0):  # 0 frag, 1 tags, 2 segments, 3 blocks, 4 block,
        self.u8(REPORT), self.u8(kind)  # 5 trace, 6 reset stats, 7 reset tag peaks
        if kind == 4:
            self.u16(index)
        return self

    def all_reports(self):
        for kind in range(8):
            self.report(kind)
        return self

    # --- private pools, captures, checkpoints, configuration -----------------
    # pool index: 0 -> (1, 0), 1 -> (2, 0), 2 -> (0, 3)
    def pool_create(self, pool=0):
        self.u8(POOL), self.u8(pool), self.u8(0)
        return self

    def pool_route(self, pool=0, stream=None):  # stream None: every stream
        self.u8(POOL), self.u8(pool), self.u8(1), self.u8(0 if stream is None else 1)
        self.u8(0 if stream is None else stream)
        return self

    def pool_end(self, pool=0):
        self.u8(POOL), self.u8(pool), self.u8(2)
        return self

    def pool_release(self, pool=0):
        self.u8(POOL), self.u8(pool), self.u8(3)
        return self

    def pool_no_split(self, pool=0):
        self.u8(POOL), self.u8(pool), self.u8(4)
        return self

    def pool_use_on_oom(self, pool=0, on=True):
        self.u8(POOL), self.u8(pool), self.u8(5), self.u8(0 if on else 1)
        return self

    def pool_empty_cache(self, pool=0):
        self.u8(POOL), self.u8(pool), self.u8(6)
        return self

    def pool_check_live(self, pool=0):
        self.u8(POOL), self.u8(pool), self.u8(7)
        return self

    def capture_begin(self):
        self.u8(CAPTURE), self.u8(0)
        return self

    def capture_end(self):
        self.u8(CAPTURE), self.u8(1)
        return self

    def checkpoint(self, slot=0, pool=0):
        self.u8(CHECKPOINT), self.u8(slot), self.u8(pool), self.u8(0)
        return self

    def restore(self, slot=0, pool=0):
        self.u8(CHECKPOINT), self.u8(slot), self.u8(pool), self.u8(1)
        return self

    def max_split(self, mib, non_split_mib=20):  # mib >= 20; None: no max_split_size
        self.u8(CONFIG), self.u8(0), self.u8(0 if mib is None else 1)
        if mib is not None:
            self.u8(mib - 20)
        self.u8(non_split_mib)
        return self

    def power2_divisions(self, index):  # index into {0, 1, 2, 4, 8, 16}, every interval
        self.u8(CONFIG), self.u8(1)
        for _ in range(16):
            self.u8(index)
        return self

    def gc_threshold(self, byte):  # byte / 255; 0: off
        self.u8(CONFIG), self.u8(2), self.u8(0 if byte == 0 else 1)
        if byte:
            self.u8(byte)
        return self

    # A short training-like step reaching every backend call.
    def workload(self):
        self.set_fraction(255)
        self.alloc_small(1000).alloc_medium(5 << 20)
        self.record_stream(0, 1).free(0)
        self.process_events().complete_all().process_events()
        self.alloc_small(1000)
        self.record_stream(0, 2).free(0)
        self.set_capacity(64 << 20)
        self.alloc_medium(44 << 20)
        self.free(0).free(0).complete_all().process_events().empty_cache()
        return self


def seeds():
    s = {}
    s["alloc-free"] = Program().alloc_small(1000).alloc_small(4096).free(0).free(0).all_reports()
    for name in ["511", "512", "513", "1M", "1M+1", "2M", "10M-512", "10M", "20M+1", "32M-512",
                 "32M", "32M+1"]:
        p = Program()
        for delta in (0, 1, 255):
            p.alloc_boundary(name, delta)
        s[f"boundary-{name}"] = p.free(1).free(0).report(0).empty_cache().report(2)
    s["invalid-sizes"] = (Program().alloc_zero().alloc_boundary("max").alloc_boundary("max+1")
                          .alloc_boundary("SIZE_MAX").alloc_raw(1 << 62).alloc_raw(2**64 - 1))
    s["huge-capacity-sizes"] = (Program().set_capacity_raw(2**64 - 1).alloc_boundary("max")
                                .alloc_boundary("max-1").alloc_raw(1 << 59).alloc_raw(1 << 59)
                                .set_fraction(255).report(0).empty_cache())
    s["near-capacity"] = Program().alloc_near_capacity(0).alloc_near_capacity(4096).free(0)
    s["powers-of-two"] = (Program().alloc_power_of_two(20).alloc_power_of_two(21, 2)
                          .alloc_power_of_two(25, 0).free(1).all_reports())
    s["split-merge"] = (Program().alloc_small(512).alloc_small(512).alloc_small(512)
                        .alloc_small(512).free(1).free(1).alloc_small(1024).free(0)
                        .report(2).empty_cache())
    s["streams-pending"] = (Program().alloc_small(4096, 0).record_stream(0, 1).record_stream(0, 2)
                            .free(0).alloc_small(4096, 0).complete_stream(1).process_events()
                            .complete_stream(2).process_events().free(0).empty_cache())
    s["auto-complete"] = (Program().toggle_auto_complete().alloc_small(4096).record_stream(0, 3)
                          .free(0).process_events().empty_cache())
    s["oom-limit"] = (Program().set_limit(4 << 20).alloc_small(1 << 20).alloc_small(1 << 20)
                      .alloc_small(1 << 20).alloc_medium(3 << 20).remove_limit()
                      .alloc_medium(3 << 20).report(0))
    s["oom-retry"] = (Program().set_capacity(24 << 20).alloc_medium(5 << 20).free(0)
                      .alloc_medium(21 << 20).free(0).report(0))
    s["oom-pending-retry"] = (Program().set_capacity(40 << 20).alloc_medium(5 << 20)
                              .record_stream(0, 1).free(0).alloc_medium(30 << 20).report(0))
    s["fractions"] = (Program().set_fraction(128).set_fraction(1).set_fraction(0)
                      .set_fraction_double(float("nan")).set_fraction_double(-1.0)
                      .set_fraction_double(1.5).set_fraction_double(1e-300).alloc_small(512))
    s["limit-boundaries"] = (Program().set_limit_boundary("2M").alloc_small(1000)
                             .alloc_medium(5 << 20).set_limit_boundary("SIZE_MAX")
                             .alloc_medium(5 << 20).set_limit_boundary("1"))
    for call in CALLS:
        for pattern, label in ((0, "once"), (3, "always"), (4, "random")):
            p = Program().fault(call, pattern, INTERNAL, n=127, seed=7).workload()
            s[f"fault-{call}-{label}"] = p.clear_faults().workload()
    s["fault-oom-in-retry"] = (Program().set_capacity(40 << 20).alloc_medium(5 << 20).free(0)
                               .fault("AllocateSegment", 2, RESOURCE_EXHAUSTED, n=1)
                               .alloc_medium(30 << 20).alloc_medium(30 << 20))
    s["fault-release-in-retry"] = (Program().set_capacity(40 << 20).alloc_medium(5 << 20)
                                   .free(0).fault("ReleaseSegment", 0).alloc_medium(30 << 20)
                                   .alloc_medium(8 << 20).free(0).alloc_medium(30 << 20))
    s["fault-sync-in-retry"] = (Program().set_capacity(40 << 20).alloc_medium(5 << 20)
                                .record_stream(0, 1).free(0).fault("SynchronizeEvent", 0)
                                .alloc_medium(30 << 20).alloc_small(4096)
                                .alloc_medium(30 << 20))
    s["fault-capacity-fraction"] = (Program().fault("Capacity", 3, UNAVAILABLE)
                                    .set_fraction(100).set_fraction(200).clear_faults()
                                    .set_fraction(100))
    s["forbid"] = (Program().alloc_small(4096).free(0).forbid().alloc_small(4096)
                   .alloc_medium(5 << 20).forbid(False).alloc_medium(5 << 20))
    s["tags"] = (Program().push_tag(0).alloc_small(1000).push_tag(1).alloc_small(2000)
                 .pop_wrong_tag(0).pop_tag().push_bogus_tag(0).push_bogus_tag(1).pop_tag()
                 .pop_tag().report(1).free(0).report(1))
    s["scopes"] = (Program().open_scope().alloc_small(1000).open_scope().alloc_small(2000)
                   .close_scope_out_of_order(0).close_scope().close_scope()
                   .close_unknown_scope(12345).free(0).free(0))
    s["scope-pending"] = (Program().open_scope().alloc_small(4096).record_stream(0, 1).free(0)
                          .close_scope().complete_all().process_events())
    s["bad-frees"] = (Program().alloc_small(4096).alloc_small(8192).free_interior(0, 100)
                      .free_unknown(0x1234).free(0, mode=2).free(0, mode=1).free_again(0)
                      .free_again(1).free(0))
    s["trace-reports"] = (Program().trace_capacity(4).alloc_small(1000).alloc_small(1000)
                          .free(0).free(0).report(5).trace_capacity(0).report(5)
                          .trace_capacity(1024).alloc_medium(12 << 20).all_reports())
    s["pool-route"] = (Program().pool_create(0).pool_route(0).alloc_small(1000).free(0)
                       .pool_end(0).alloc_small(1000).pool_check_live(0).pool_release(0)
                       .pool_release(0).pool_empty_cache(0).free(0).empty_cache())
    s["pool-graph-hazard"] = (Program().pool_route(0, stream=0).alloc_medium(5 << 20).free(0)
                              .pool_end(0).alloc_medium(5 << 20).pool_route(0, stream=0)
                              .alloc_medium(5 << 20).pool_end(0).report(2).pool_release(0)
                              .pool_release(0).empty_cache())
    s["pool-no-split-oom"] = (Program().pool_create(1).pool_no_split(1).pool_use_on_oom(1)
                              .pool_route(1, stream=1).alloc_small(4096, 1).free(0).pool_end(1)
                              .set_limit(4 << 20).alloc_small(1 << 20, 1)
                              .alloc_small(1 << 20, 1).alloc_small(4096, 1).pool_release(1)
                              .pool_release(1).remove_limit())
    s["capture-deferred"] = (Program().alloc_small(4096).record_stream(0, 1).capture_begin()
                             .pool_route(2, stream=0).free(0).alloc_medium(3 << 20)
                             .process_events().empty_cache().pool_end(2).capture_end()
                             .complete_all().process_events().pool_release(2).empty_cache())
    s["checkpoint-restore"] = (Program().pool_route(0, stream=0).alloc_small(100 << 10)
                               .alloc_small(200 << 10).alloc_small(300 << 10).free(1)
                               .checkpoint(0, 0).free(0).free(0).alloc_small(500 << 10)
                               .restore(0, 0).pool_check_live(0).pool_end(0).restore(0, 0)
                               .pool_release(0))
    s["config-knobs"] = (Program().max_split(31).alloc_medium(40 << 20).free(0)
                         .alloc_medium(20 << 20).alloc_medium(35 << 20).power2_divisions(3)
                         .alloc_small(1258291).set_limit(100, 20).gc_threshold(150)
                         .alloc_medium(12 << 20).free(0).alloc_medium(30 << 20)
                         .max_split(None).power2_divisions(0).gc_threshold(0))
    return s


def main():
    CORPUS.mkdir(exist_ok=True)
    for old in CORPUS.glob("seed-*"):
        old.unlink()
    programs = seeds()
    for name, program in programs.items():
        (CORPUS / f"seed-{name}").write_bytes(bytes(program.out))
    print(f"wrote {len(programs)} seeds to {CORPUS}")


if __name__ == "__main__":
    main()
