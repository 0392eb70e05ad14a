// Engine: one engine exposed as a Python object, and its reports as plain
// data. An engine is either owned by Python (a standalone host-memory
// engine, for tests and experiments) or borrowed from the torch glue (the
// engines behind PyTorch's allocators, which live for the whole process).
#include <memory>

#include <pybind11/stl.h>

#include "torchmem/backends/host_backend.h"
#include "torchmem/core/engine.h"
#include "torchmem/python/bindings.h"

namespace torchmem::python {
namespace {

py::dict FreeSpaceToDict(const FreeSpaceStats& stats) {
  py::dict d;
  d["reserved_bytes"] = stats.reserved_bytes;
  d["allocated_bytes"] = stats.allocated_bytes;
  d["requested_bytes"] = stats.requested_bytes;
  d["free_bytes"] = stats.free_bytes;
  d["pending_free_bytes"] = stats.pending_free_bytes;
  d["largest_free_block"] = stats.largest_free_extent;
  d["free_blocks"] = stats.free_extents;
  d["inactive_split_bytes"] = stats.inactive_split_bytes;
  d["internal_waste_bytes"] = stats.internal_waste_bytes;
  d["external_fragmentation"] = stats.external_fragmentation;
  py::list histogram;
  for (std::size_t k = 0; k < stats.histogram_counts.size(); ++k) {
    if (stats.histogram_counts[k] == 0) continue;
    histogram.append(
        py::make_tuple(std::int64_t{1} << k, stats.histogram_counts[k], stats.histogram_bytes[k]));
  }
  d["free_block_histogram"] = histogram;  // (lower bound, count, bytes)
  return d;
}

py::dict FragmentationToDict(const FragmentationReport& report) {
  py::dict d = FreeSpaceToDict(report.all);
  d["small_pool"] = FreeSpaceToDict(report.small_pool);
  d["large_pool"] = FreeSpaceToDict(report.large_pool);
  py::dict by_stream;
  for (const auto& [stream, stats] : report.by_stream)
    by_stream[py::int_(stream)] = FreeSpaceToDict(stats);
  d["by_stream"] = by_stream;
  return d;
}

py::dict TagUsageToDict(const TagUsage& usage) {
  py::dict d;
  d["tag"] = TagRegistry::Name(usage.tag);
  d["current_bytes"] = usage.current_bytes;
  d["peak_bytes"] = usage.peak_bytes;
  d["requested_bytes"] = usage.current_requested_bytes;
  d["live_blocks"] = usage.live_blocks;
  d["allocations"] = usage.total_allocations;
  d["allocated_bytes"] = usage.total_allocated_bytes;
  return d;
}

py::dict SegmentToDict(const SegmentInfo& segment) {
  py::dict d;
  d["address"] = segment.address;
  d["size"] = segment.size;
  d["pool"] = PoolName(segment.pool);
  d["stream"] = segment.stream;
  d["vmm"] = segment.vmm;
  d["mapped_bytes"] = segment.mapped_bytes;
  py::list blocks;
  for (const BlockInfo& block : segment.blocks) blocks.append(BlockToDict(block));
  d["blocks"] = blocks;
  return d;
}

EngineHandle MakeHostEngine(std::size_t capacity_bytes, std::size_t memory_limit_bytes,
                            std::size_t small_segment_size, std::size_t large_segment_size) {
  EngineOptions options;
  options.memory_limit_bytes = memory_limit_bytes;
  if (small_segment_size != 0) options.policy.small_segment_size = small_segment_size;
  if (large_segment_size != 0) options.policy.large_segment_size = large_segment_size;
  ThrowIfError(options.policy.Validate());
  auto engine = std::make_shared<Engine>(
      std::make_unique<HostBackend>(HostBackendOptions{.capacity_bytes = capacity_bytes}), options);
  Engine* raw = engine.get();
  return EngineHandle{std::move(engine), raw};
}

}  // namespace

py::dict BlockToDict(const BlockInfo& block) {
  py::dict d;
  d["address"] = block.address;
  d["size"] = block.size;
  d["requested_size"] = block.requested_size;
  d["stream"] = block.stream;
  d["pool"] = PoolName(block.pool);
  d["state"] = BlockStateName(block.state);
  d["tag"] = block.tag == kNoTag ? py::object(py::none()) : py::str(TagRegistry::Name(block.tag));
  d["scope"] = block.scope;
  d["context"] = block.context;
  d["sequence"] = block.sequence;
  return d;
}

py::dict SurvivorsToDict(const ScopeSurvivors& survivors) {
  py::dict d;
  d["device"] = survivors.device;
  py::list allocated, pending;
  for (const BlockInfo& block : survivors.allocated) allocated.append(BlockToDict(block));
  for (const BlockInfo& block : survivors.pending) pending.append(BlockToDict(block));
  d["allocated"] = allocated;
  d["pending"] = pending;
  return d;
}

py::object WrapBorrowedEngine(Engine& engine) { return py::cast(EngineHandle{nullptr, &engine}); }

void RegisterEngine(py::module_& m) {
  py::class_<EngineHandle>(m, "Engine",
                           "A torchmem caching allocator engine. Sizes and addresses are ints.")
      .def(py::init(&MakeHostEngine), py::arg("capacity_bytes") = 0,
           py::arg("memory_limit_bytes") = 0, py::arg("small_segment_size") = 0,
           py::arg("large_segment_size") = 0,
           "A standalone engine over host memory (capacity 0: the machine's RAM).")
      .def_property_readonly("device", [](EngineHandle& h) { return h->DeviceName(); })
      .def(
          "allocate",
          [](EngineHandle& h, std::size_t size, std::uintptr_t stream) {
            absl::StatusOr<void*> ptr;
            {
              py::gil_scoped_release release;
              ptr = h->Allocate(size, stream);
            }
            ThrowIfError(ptr.status());
            return reinterpret_cast<std::uintptr_t>(*ptr);
          },
          py::arg("size"), py::arg("stream") = 0)
      .def(
          "free",
          [](EngineHandle& h, std::uintptr_t address, std::optional<std::size_t> size) {
            absl::Status status;
            {
              py::gil_scoped_release release;
              void* ptr = reinterpret_cast<void*>(address);
              status = size.has_value() ? h->FreeSized(ptr, *size) : h->Free(ptr);
            }
            ThrowIfError(status);
          },
          py::arg("address"), py::arg("size") = std::nullopt)
      .def(
          "record_stream",
          [](EngineHandle& h, std::uintptr_t address, std::uintptr_t stream) {
            absl::Status status;
            {
              py::gil_scoped_release release;
              status = h->RecordStream(reinterpret_cast<void*>(address), stream);
            }
            ThrowIfError(status);
          },
          py::arg("address"), py::arg("stream"))
      .def("process_events",
           [](EngineHandle& h) {
             py::gil_scoped_release release;
             h->ProcessEvents();
           })
      .def("empty_cache",
           [](EngineHandle& h) {
             absl::Status status;
             {
               py::gil_scoped_release release;
               status = h->EmptyCache();
             }
             ThrowIfError(status);
           })
      .def(
          "set_memory_limit", [](EngineHandle& h, std::size_t bytes) { h->SetMemoryLimit(bytes); },
          py::arg("bytes"))
      .def(
          "set_memory_fraction",
          [](EngineHandle& h, double fraction) { ThrowIfError(h->SetMemoryFraction(fraction)); },
          py::arg("fraction"))
      .def_property_readonly("memory_limit", [](EngineHandle& h) { return h->memory_limit(); })
      .def("memory_stats",
           [](EngineHandle& h) {
             MemoryStats stats;
             {
               py::gil_scoped_release release;
               stats = h->GetStats();
             }
             py::dict d;
             for (const auto& [key, value] : stats.Flatten()) d[py::str(key)] = value;
             return d;
           })
      .def(
          "event_health",
          [](EngineHandle& h) {
            EventHealth health;
            {
              py::gil_scoped_release release;
              health = h->GetEventHealth();
            }
            py::dict d;
            d["outstanding_events"] = health.outstanding_events;
            d["streams_with_events"] = health.streams_with_events;
            d["deferred_frees"] = health.deferred_frees;
            d["event_query_errors"] = health.event_query_errors;
            d["event_sync_errors"] = health.event_sync_errors;
            return d;
          },
          "Events and deferred frees of cross-stream reuse, and the event errors seen")
      .def("reset_peak_stats", [](EngineHandle& h) { h->ResetPeakStats(); })
      .def("reset_accumulated_stats", [](EngineHandle& h) { h->ResetAccumulatedStats(); })
      .def("tag_stats",
           [](EngineHandle& h) {
             std::vector<TagUsage> usage;
             {
               py::gil_scoped_release release;
               usage = h->GetTagUsage();
             }
             py::list out;
             for (const TagUsage& entry : usage) out.append(TagUsageToDict(entry));
             return out;
           })
      .def("reset_tag_peaks", [](EngineHandle& h) { h->ResetTagPeaks(); })
      .def("fragmentation",
           [](EngineHandle& h) {
             FragmentationReport report;
             {
               py::gil_scoped_release release;
               report = h->GetFragmentation();
             }
             return FragmentationToDict(report);
           })
      .def("segments",
           [](EngineHandle& h) {
             std::vector<SegmentInfo> segments;
             {
               py::gil_scoped_release release;
               segments = h->GetSegments();
             }
             py::list out;
             for (const SegmentInfo& segment : segments) out.append(SegmentToDict(segment));
             return out;
           })
      .def("allocated_blocks",
           [](EngineHandle& h) {
             std::vector<BlockInfo> blocks;
             {
               py::gil_scoped_release release;
               blocks = h->GetAllocatedBlocks();
             }
             py::list out;
             for (const BlockInfo& block : blocks) out.append(BlockToDict(block));
             return out;
           })
      .def(
          "block",
          [](EngineHandle& h, std::uintptr_t address) {
            absl::StatusOr<BlockInfo> block = h->GetBlock(reinterpret_cast<void*>(address));
            ThrowIfError(block.status());
            return BlockToDict(*block);
          },
          py::arg("address"))
      .def(
          "set_trace_capacity",
          [](EngineHandle& h, std::size_t max_entries) { h->SetTraceCapacity(max_entries); },
          py::arg("max_entries"), "Records the last `max_entries` events; 0 stops recording.")
      .def("trace",
           [](EngineHandle& h) {
             std::vector<TraceEntry> entries;
             {
               py::gil_scoped_release release;
               entries = h->GetTrace();
             }
             py::list out;
             for (const TraceEntry& entry : entries) {
               py::dict d;
               d["action"] = TraceActionName(entry.action);
               d["addr"] = entry.address;
               d["size"] = entry.size;
               d["stream"] = entry.stream;
               d["context"] = entry.context;
               d["time_us"] = entry.time_us;
               out.append(d);
             }
             return out;
           })
      .def("check_invariants", [](EngineHandle& h) {
        absl::Status status;
        {
          py::gil_scoped_release release;
          status = h->CheckInvariants();
        }
        ThrowIfError(status);
      });
}

}  // namespace torchmem::python
