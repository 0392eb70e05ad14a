// trace_replay: replays allocation traces through torchmem's engine and
// prints what it reserved, one JSON object per trace (JSON Lines).
//
// Input: CSV traces in the format of ../shared/traces (see its README and
// trace_csv.h): `op,addr,size,stream` rows. Replay rules:
//   - `alloc` rows are replayed as Engine::Allocate(size, stream); `free` rows
//     as Engine::Free of the pointer the engine returned for that trace
//     address. Trace addresses are only identifiers, mapped to engine
//     pointers.
//   - A `free` of an address not allocated inside the trace is ignored
//     (traces start mid-run), and counted.
//   - An `alloc` of an address that is still live in the replay means the
//     trace lost that block's free (the original allocator could hand the
//     address out again only after it was freed): the old block is freed
//     first, and counted as an implicit free.
//   - `alloc` of 0 bytes is skipped (PyTorch returns a null pointer without
//     asking the allocator), and counted.
//   - `empty_cache` rows call Engine::EmptyCache (replay them unless
//     --no_empty_cache); `segment_alloc`/`segment_free` rows are what the
//     original allocator did in response, not inputs: ignored (counted, for
//     reference); `oom` and unknown ops are ignored and counted.
// The engine runs over ControlledBackend with fake address ranges (no memory
// behind them), so a 60 GiB peak costs nothing; its capacity is 1 PiB so
// nothing fails for lack of memory.
//
// Engine variants: each trace is replayed once per variant (--variants),
// and every row names its variant. The variants are the engine
// configurations this build can replay; --list_variants prints them as JSON
// ({"variants": [{"name": ..., "description": ...}]}), which is how
// run_all.py learns which columns of its report can be measured. Today:
//   pytorch  the engine as torchmem ships it: PyTorch's size policy and
//            placement (best fit, PyTorch's tie-breaks), segments from the
//            backend. run_all's "torchmem (PyTorch-identical)" column.
//   vmm      the virtual-memory placement (expandable_segments:True): one
//            address range per pool, page fit, pages mapped where live
//            blocks are (2 MiB in the small pool, 20 MiB in the large one),
//            lazy unmapping, cached pages moved only under memory pressure
//            (Placement::kVirtualMemory). run_all's "torchmem VMM" column;
//            reserved bytes are the mapped pages, and the rows count the
//            backend's map and unmap calls.
//   vmm_2mib the same with 2 MiB pages in the large pool too: the other side
//            of the page size's trade-off (less memory, more calls).
//
// Output per trace: ops replayed, peak reserved / allocated / requested,
// final reserved, device (backend segment) allocs and frees, ns per op
// (--clock=cpu, the default: the thread's CPU time, which other processes on a
// shared machine disturb much less; --clock=wall: steady_clock)
// (median of --repeat timed replays on fresh engines; the time includes the
// replayer's address map and the fake backend's calls), warm ns per op
// (median of --warm_passes further passes over one engine after a first,
// untimed one, survivors freed at the end of each pass: the steady state of
// a training loop; warm_device_allocs says how many segments those passes
// still needed), and the engine's
// fragmentation report at the moment reserved bytes first reached their peak
// and at the moment allocated bytes did (from a separate, untimed replay that
// checks the stats after every operation).
//
// Run:
//   cmake --build build/bench --target trace_replay
//   build/bench/benchmarks/trace_replay [--repeat=N] [--warm_passes=N] [--no_empty_cache]
//       [--clock=cpu|wall] [--variants=all|NAME,...] [PATH ...]
//   build/bench/benchmarks/trace_replay --list_variants
// PATH is a trace file or a directory of *.csv traces; without a PATH it
// replays every trace in $TORCHMEM_TRACES_DIR, else /work/shared/traces.
// Exit status 1 if a file cannot be read or parsed (the other traces are
// still replayed).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "doubles/controlled_backend.h"
#include "torchmem/core/engine.h"
#include "trace_csv.h"

namespace torchmem_bench {
namespace {

using torchmem::Engine;
using torchmem::FreeSpaceStats;
using torchmem::MemoryStats;

// An engine configuration the replay can run (see the header comment).
struct Variant {
  std::string name;
  std::string description;
  std::unique_ptr<Engine> (*make)();
};

struct Options {
  std::vector<const Variant*> variants;  // empty: all
  int repeat = 5;
  bool cpu_clock = true;  // --clock=cpu (default) or wall
  int warm_passes = 5;
  bool empty_cache = true;
  std::vector<std::string> paths;
};

struct ReplayCounts {
  std::int64_t ops = 0;  // alloc + free + empty_cache calls made on the engine
  std::int64_t allocs = 0;
  std::int64_t frees = 0;
  std::int64_t empty_caches = 0;
  std::int64_t unknown_frees = 0;
  std::int64_t implicit_frees = 0;
  std::int64_t zero_size_allocs = 0;
  std::int64_t failed_allocs = 0;
  std::int64_t segment_rows = 0;
  std::int64_t oom_rows = 0;
  std::int64_t unknown_ops = 0;
  std::string first_error;
};

// Nanoseconds on the chosen clock: this thread's CPU time, or steady_clock.
double NowNs(bool cpu_clock) {
  if (cpu_clock) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::unique_ptr<Engine> NewPyTorchIdenticalEngine() {
  torchmem::ControlledBackendOptions options;
  options.device_name = "replay:0";
  options.capacity_bytes = std::size_t{1} << 50;
  options.auto_complete_events = true;
  return std::make_unique<Engine>(std::make_unique<torchmem::ControlledBackend>(options));
}

std::unique_ptr<Engine> NewVirtualMemoryEngine(std::size_t large_page) {
  torchmem::ControlledBackendOptions options;
  options.device_name = "replay:0";
  options.capacity_bytes = std::size_t{1} << 50;
  options.auto_complete_events = true;
  torchmem::EngineOptions engine_options;
  engine_options.placement = torchmem::Placement::kVirtualMemory;
  engine_options.policy.vmm_large_page_size = large_page;
  return std::make_unique<Engine>(std::make_unique<torchmem::ControlledBackend>(options),
                                  engine_options);
}

std::unique_ptr<Engine> NewVirtualMemoryEngineOfPyTorchPages() {
  return NewVirtualMemoryEngine(torchmem::SizePolicy{}.vmm_large_page_size);
}

std::unique_ptr<Engine> NewVirtualMemoryEngineOfSmallPages() {
  return NewVirtualMemoryEngine(2 * torchmem::kMiB);
}

// The engine variants this build replays, in report order.
const std::vector<Variant>& Variants() {
  static const std::vector<Variant> variants = {
      {"pytorch",
       "PyTorch's size policy and best-fit placement over backend segments (torchmem's "
       "default)",
       &NewPyTorchIdenticalEngine},
      {"vmm",
       "virtual-memory placement (expandable_segments:True): page fit in one address range per "
       "pool, pages mapped on demand (2 MiB in the small pool, 20 MiB in the large one, as "
       "PyTorch's expandable segments), lazy unmapping, cached pages moved only under pressure",
       &NewVirtualMemoryEngineOfPyTorchPages},
      {"vmm_2mib",
       "the virtual-memory placement with 2 MiB pages in the large pool too "
       "(SizePolicy::vmm_large_page_size): finer mappings, ten times the calls",
       &NewVirtualMemoryEngineOfSmallPages},
  };
  return variants;
}

const Variant* FindVariant(absl::string_view name) {
  for (const Variant& variant : Variants()) {
    if (variant.name == name) return &variant;
  }
  return nullptr;
}

void NoteError(ReplayCounts& counts, const absl::Status& status) {
  if (counts.first_error.empty()) counts.first_error = status.ToString();
}

// Replays `trace` into `engine`, calling observe(engine, event) after every
// operation made on the engine (a no-op in timed runs).
// Blocks still live at the end of the trace stay allocated unless
// `free_survivors`.
template <typename Observer>
ReplayCounts Replay(const Trace& trace, Engine& engine, bool empty_cache, Observer observe,
                    bool free_survivors = false) {
  ReplayCounts counts;
  absl::flat_hash_map<std::uint64_t, void*> live;
  live.reserve(trace.events.size() / 2 + 1);
  for (const TraceEvent& event : trace.events) {
    switch (event.op) {
      case TraceOp::kAlloc: {
        if (event.size == 0) {
          ++counts.zero_size_allocs;
          continue;
        }
        auto [it, inserted] = live.try_emplace(event.addr, nullptr);
        if (!inserted) {
          if (absl::Status freed = engine.Free(it->second); !freed.ok()) NoteError(counts, freed);
          ++counts.implicit_frees;
          ++counts.ops;
        }
        absl::StatusOr<void*> ptr = engine.Allocate(event.size, event.stream);
        ++counts.ops;
        if (!ptr.ok()) {
          NoteError(counts, ptr.status());
          ++counts.failed_allocs;
          live.erase(it);
          continue;
        }
        it->second = *ptr;
        ++counts.allocs;
        break;
      }
      case TraceOp::kFree: {
        auto it = live.find(event.addr);
        if (it == live.end()) {
          ++counts.unknown_frees;
          continue;
        }
        if (absl::Status freed = engine.Free(it->second); !freed.ok()) NoteError(counts, freed);
        live.erase(it);
        ++counts.frees;
        ++counts.ops;
        break;
      }
      case TraceOp::kEmptyCache:
        if (!empty_cache) continue;
        if (absl::Status emptied = engine.EmptyCache(); !emptied.ok()) NoteError(counts, emptied);
        ++counts.empty_caches;
        ++counts.ops;
        break;
      case TraceOp::kSegmentAlloc:
      case TraceOp::kSegmentFree:
        ++counts.segment_rows;
        continue;
      case TraceOp::kOom:
        ++counts.oom_rows;
        continue;
      case TraceOp::kUnknown:
        ++counts.unknown_ops;
        continue;
    }
    observe(engine);
  }
  if (free_survivors) {
    for (const auto& [addr, ptr] : live) {
      if (absl::Status freed = engine.Free(ptr); !freed.ok()) NoteError(counts, freed);
    }
  }
  return counts;
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string FragmentationJson(const FreeSpaceStats& stats) {
  return absl::StrFormat(
      "{\"reserved_bytes\": %d, \"allocated_bytes\": %d, \"requested_bytes\": %d, "
      "\"free_bytes\": %d, \"largest_free_extent\": %d, \"free_extents\": %d, "
      "\"inactive_split_bytes\": %d, \"internal_waste_bytes\": %d, "
      "\"external_fragmentation\": %.4f}",
      stats.reserved_bytes, stats.allocated_bytes, stats.requested_bytes, stats.free_bytes,
      stats.largest_free_extent, stats.free_extents, stats.inactive_split_bytes,
      stats.internal_waste_bytes, stats.external_fragmentation);
}

// Replays one trace with one engine variant: an observed pass for the
// figures, then timed passes.
std::string ReplayTrace(const Trace& trace, const Variant& variant, const Options& options) {
  // Observed pass.
  std::unique_ptr<Engine> engine = variant.make();
  std::int64_t max_reserved = 0;
  std::int64_t max_allocated = 0;
  FreeSpaceStats at_peak_reserved;
  FreeSpaceStats at_peak_allocated;
  ReplayCounts counts = Replay(trace, *engine, options.empty_cache, [&](Engine& e) {
    const MemoryStats stats = e.GetStats();
    const std::int64_t reserved = stats.reserved_bytes.all().current;
    const std::int64_t allocated = stats.allocated_bytes.all().current;
    if (reserved > max_reserved) {
      max_reserved = reserved;
      at_peak_reserved = e.GetFragmentation().all;
    }
    if (allocated > max_allocated) {
      max_allocated = allocated;
      at_peak_allocated = e.GetFragmentation().all;
    }
  });
  const MemoryStats stats = engine->GetStats();
  engine.reset();

  // Timed passes on fresh engines.
  std::vector<double> ns_per_op;
  for (int r = 0; r < options.repeat; ++r) {
    std::unique_ptr<Engine> timed = variant.make();
    const double start = NowNs(options.cpu_clock);
    ReplayCounts timed_counts = Replay(trace, *timed, options.empty_cache, [](Engine&) {});
    const double ns = NowNs(options.cpu_clock) - start;
    ns_per_op.push_back(timed_counts.ops == 0 ? 0.0 : ns / static_cast<double>(timed_counts.ops));
  }
  std::sort(ns_per_op.begin(), ns_per_op.end());
  const double median_ns = ns_per_op.empty() ? 0.0 : ns_per_op[ns_per_op.size() / 2];

  // Warm passes: the trace replayed again and again on one engine (blocks
  // still live at the end of a pass are freed), like the steps of a
  // training loop; the first pass warms the cache and is not timed.
  std::vector<double> warm_ns_per_op;
  std::int64_t warm_device_allocs = 0;
  std::int64_t warm_peak_reserved = 0;
  std::int64_t warm_vmm_maps = 0;
  std::int64_t warm_vmm_unmaps = 0;
  if (options.warm_passes > 0) {
    std::unique_ptr<Engine> warm = variant.make();
    (void)Replay(
        trace, *warm, options.empty_cache, [](Engine&) {}, true);
    const MemoryStats warm_before = warm->GetStats();
    const std::int64_t device_allocs_before = warm_before.num_device_alloc;
    for (int pass = 0; pass < options.warm_passes; ++pass) {
      const double start = NowNs(options.cpu_clock);
      ReplayCounts warm_counts = Replay(
          trace, *warm, options.empty_cache, [](Engine&) {}, true);
      const double ns = NowNs(options.cpu_clock) - start;
      warm_ns_per_op.push_back(warm_counts.ops == 0 ? 0.0
                                                    : ns / static_cast<double>(warm_counts.ops));
    }
    const MemoryStats warm_stats = warm->GetStats();
    warm_device_allocs = warm_stats.num_device_alloc - device_allocs_before;
    warm_vmm_maps = warm_stats.vmm.maps - warm_before.vmm.maps;
    warm_vmm_unmaps = warm_stats.vmm.unmaps - warm_before.vmm.unmaps;
    warm_peak_reserved = warm_stats.reserved_bytes.all().peak;
    std::sort(warm_ns_per_op.begin(), warm_ns_per_op.end());
  }
  const double warm_median_ns =
      warm_ns_per_op.empty() ? 0.0 : warm_ns_per_op[warm_ns_per_op.size() / 2];

  const std::int64_t peak_reserved = stats.reserved_bytes.all().peak;
  const std::int64_t peak_requested = stats.requested_bytes.all().peak;
  std::string json = absl::StrFormat(
      "{\"trace\": %s, \"allocator\": \"torchmem_engine\", \"variant\": %s, \"events\": %d, "
      "\"ops_replayed\": %d, \"allocs\": %d, \"frees\": %d, \"empty_cache_calls\": %d, "
      "\"ignored_unknown_frees\": %d, \"implicit_frees\": %d, \"zero_size_allocs\": %d, "
      "\"failed_allocs\": %d, \"ignored_segment_rows\": %d, \"ignored_oom_rows\": %d, "
      "\"ignored_unknown_ops\": %d, "
      "\"peak_reserved_bytes\": %d, \"peak_allocated_bytes\": %d, "
      "\"peak_requested_bytes\": %d, \"final_reserved_bytes\": %d, "
      "\"peak_reserved_over_peak_requested\": %.4f, "
      "\"num_device_alloc\": %d, \"num_device_free\": %d, "
      "\"ns_per_op\": %.1f, \"clock\": \"%s\", \"timed_repeats\": %d, "
      "\"warm_ns_per_op\": %.1f, \"warm_passes\": %d, \"warm_device_allocs\": %d, "
      "\"warm_peak_reserved_bytes\": %d, "
      "\"vmm_maps\": %d, \"vmm_unmaps\": %d, \"vmm_creates\": %d, \"vmm_steals\": %d, "
      "\"vmm_set_access\": %d, \"warm_vmm_maps\": %d, \"warm_vmm_unmaps\": %d, "
      "\"fragmentation_at_peak_reserved\": %s, \"fragmentation_at_peak_allocated\": %s",
      JsonString(trace.name), JsonString(variant.name), trace.events.size(), counts.ops,
      counts.allocs, counts.frees, counts.empty_caches, counts.unknown_frees, counts.implicit_frees,
      counts.zero_size_allocs, counts.failed_allocs, counts.segment_rows, counts.oom_rows,
      counts.unknown_ops, peak_reserved, stats.allocated_bytes.all().peak, peak_requested,
      stats.reserved_bytes.all().current,
      peak_requested == 0
          ? 0.0
          : static_cast<double>(peak_reserved) / static_cast<double>(peak_requested),
      stats.num_device_alloc, stats.num_device_free, median_ns, options.cpu_clock ? "cpu" : "wall",
      options.repeat, warm_median_ns, options.warm_passes, warm_device_allocs, warm_peak_reserved,
      stats.vmm.maps, stats.vmm.unmaps, stats.vmm.creates, stats.vmm.steals, stats.vmm.set_access,
      warm_vmm_maps, warm_vmm_unmaps, FragmentationJson(at_peak_reserved),
      FragmentationJson(at_peak_allocated));
  if (!counts.first_error.empty()) {
    absl::StrAppend(&json, ", \"first_error\": ", JsonString(counts.first_error));
  }
  absl::StrAppend(&json, ", \"path\": ", JsonString(trace.path), "}");
  return json;
}

void Usage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: trace_replay [--repeat=N] [--warm_passes=N] [--no_empty_cache] [--clock=cpu|wall]\n"
      "                    [--variants=all|NAME,...] [PATH ...]\n"
      "       trace_replay --list_variants\n"
      "Replays CSV allocation traces (op,addr,size,stream) through torchmem's engine\n"
      "and prints one JSON object per trace and engine variant. PATH: a trace or a\n"
      "directory of *.csv traces (default: $TORCHMEM_TRACES_DIR, else\n"
      "/work/shared/traces).\n"
      "  --repeat=N        timed replays per trace, median reported (default 5)\n"
      "  --warm_passes=N   timed passes over a warm engine (default 5; 0: none)\n"
      "  --no_empty_cache  ignore empty_cache rows instead of calling EmptyCache\n"
      "  --clock=cpu|wall  time on the thread's CPU clock (default) or steady_clock\n"
      "  --variants=...    engine variants to replay (default all; --list_variants)\n"
      "  --list_variants   print the variants this build has, as JSON, and exit\n");
}

void ListVariants() {
  std::vector<std::string> entries;
  for (const Variant& variant : Variants()) {
    entries.push_back(absl::StrCat("{\"name\": ", JsonString(variant.name),
                                   ", \"description\": ", JsonString(variant.description), "}"));
  }
  std::printf("{\"variants\": [%s]}\n", absl::StrJoin(entries, ", ").c_str());
}

}  // namespace
}  // namespace torchmem_bench

int main(int argc, char** argv) {
  using torchmem_bench::Options;
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      torchmem_bench::Usage(stdout);
      return 0;
    } else if (arg.rfind("--repeat=", 0) == 0) {
      if (!absl::SimpleAtoi(arg.substr(9), &options.repeat) || options.repeat < 0) {
        std::fprintf(stderr, "trace_replay: bad --repeat value: %s\n", arg.c_str());
        return 2;
      }
    } else if (arg.rfind("--warm_passes=", 0) == 0) {
      if (!absl::SimpleAtoi(arg.substr(14), &options.warm_passes) || options.warm_passes < 0) {
        std::fprintf(stderr, "trace_replay: bad --warm_passes value: %s\n", arg.c_str());
        return 2;
      }
    } else if (arg == "--no_empty_cache") {
      options.empty_cache = false;
    } else if (arg == "--clock=cpu" || arg == "--clock=wall") {
      options.cpu_clock = arg == "--clock=cpu";
    } else if (arg == "--list_variants") {
      torchmem_bench::ListVariants();
      return 0;
    } else if (arg.rfind("--variants=", 0) == 0) {
      const std::string names = arg.substr(11);
      if (names == "all") continue;
      for (absl::string_view name : absl::StrSplit(names, ',', absl::SkipEmpty())) {
        const torchmem_bench::Variant* variant = torchmem_bench::FindVariant(name);
        if (variant == nullptr) {
          std::fprintf(stderr,
                       "trace_replay: this build has no engine variant %s (see "
                       "--list_variants)\n",
                       std::string(name).c_str());
          return 2;
        }
        options.variants.push_back(variant);
      }
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "trace_replay: unknown flag %s\n", arg.c_str());
      torchmem_bench::Usage(stderr);
      return 2;
    } else {
      options.paths.push_back(arg);
    }
  }
  if (options.paths.empty()) options.paths.push_back(torchmem_bench::TracesDirectory(""));
  if (options.variants.empty()) {
    for (const torchmem_bench::Variant& variant : torchmem_bench::Variants()) {
      options.variants.push_back(&variant);
    }
  }

  int status = 0;
  for (const std::string& path : options.paths) {
    absl::StatusOr<std::vector<std::string>> files = torchmem_bench::ListTraceFiles(path);
    if (!files.ok()) {
      std::fprintf(stderr, "trace_replay: %s\n", files.status().ToString().c_str());
      status = 1;
      continue;
    }
    for (const std::string& file : *files) {
      absl::StatusOr<torchmem_bench::Trace> trace = torchmem_bench::ReadTrace(file);
      if (!trace.ok()) {
        std::fprintf(stderr, "trace_replay: %s\n", trace.status().ToString().c_str());
        status = 1;
        continue;
      }
      for (const torchmem_bench::Variant* variant : options.variants) {
        std::printf("%s\n", torchmem_bench::ReplayTrace(*trace, *variant, options).c_str());
        std::fflush(stdout);
      }
    }
  }
  return status;
}
