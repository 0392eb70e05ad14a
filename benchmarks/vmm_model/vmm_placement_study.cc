// vmm_placement_study: replays allocation traces through the VMM allocator
// model (vmm_placement.h) under each placement policy and prints, per trace
// and policy, one JSON object (JSON Lines): peak physical memory (the peak
// number of 2 MiB pages backed), peak requested, and the driver calls a real
// backend would make, per 1,000 allocations.
//
// Replay rules (those of trace_replay.cc and trace_replay_native.py): `alloc`
// of 0 bytes is skipped; an `alloc` of an address still live frees the old
// block first; a `free` of an address not allocated in the trace is ignored;
// `empty_cache` rows call EmptyCache; `segment_*`, `oom` and unknown rows are
// ignored. After the first pass the trace is replayed --warm_passes more
// times on the same model (survivors freed after each pass, like the steps
// of a training loop); peak figures cover every pass, call counts are given
// for the first pass and for the warm passes apart.
//
// Run:
//   build/release/benchmarks/vmm_placement_study [--policies=all|NAME,...]
//       [--warm_passes=N] [--check] [PATH ...]
// PATH: a trace or a directory of *.csv traces (default: $TORCHMEM_TRACES_DIR,
// else /work/shared/traces). --check runs the model's invariant checker after
// every operation (slow). benchmarks/vmm_placement_study.py runs it and joins
// the figures with the measured PyTorch replays.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "trace_csv.h"
#include "vmm_model/vmm_placement.h"

namespace torchmem_bench {
namespace vmm {
namespace {

struct Options {
  std::vector<PolicyOptions> policies;
  int warm_passes = 3;
  bool check = false;
  std::vector<std::string> paths;
};

// Every combination the study compares.
std::vector<PolicyOptions> AllPolicies() {
  std::vector<PolicyOptions> all;
  const PolicyOptions defaults;
  for (Fit fit : {Fit::kBestFit, Fit::kFirstFit, Fit::kPageFit}) {
    for (Pools pools : {Pools::kShared, Pools::kSmallLarge}) {
      for (std::uint64_t large_round : {defaults.round_bytes, defaults.page_bytes}) {
        for (Unmap unmap : {Unmap::kLazy, Unmap::kEager}) {
          for (Victim victim : {Victim::kLeastRecentlyFreed, Victim::kHighestAddress}) {
            if (unmap == Unmap::kEager && victim != Victim::kLeastRecentlyFreed) continue;
            PolicyOptions policy;
            policy.fit = fit;
            policy.pools = pools;
            policy.unmap = unmap;
            policy.victim = victim;
            policy.large_round_bytes = large_round;
            all.push_back(policy);
            if (fit == Fit::kPageFit && unmap == Unmap::kLazy) {
              PolicyOptions variant = policy;
              variant.prefer_mapped = true;
              all.push_back(variant);
              if (large_round == defaults.round_bytes && victim == Victim::kHighestAddress) {
                for (int denominator : {64, 32, 16}) {
                  variant = policy;
                  variant.cache_fraction = 1.0 / denominator;
                  all.push_back(variant);
                }
              }
            }
          }
        }
      }
    }
  }
  return all;
}

struct PassResult {
  std::int64_t peak_requested = 0;
  std::int64_t allocs = 0;
  std::string error;
};

// One pass over the trace; frees what is still live at the end if asked.
PassResult ReplayPass(const Trace& trace, VmmPlacementModel& model, bool check,
                      bool free_survivors) {
  PassResult result;
  absl::flat_hash_map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>>
      live;  // -> addr, size
  std::int64_t requested = 0;
  auto note = [&](const std::string& what) {
    if (!what.empty() && result.error.empty()) result.error = what;
  };
  for (const TraceEvent& event : trace.events) {
    switch (event.op) {
      case TraceOp::kAlloc: {
        if (event.size == 0) continue;
        if (auto it = live.find(event.addr); it != live.end()) {
          model.Free(it->second.first);
          requested -= static_cast<std::int64_t>(it->second.second);
          live.erase(it);
        }
        live[event.addr] = {model.Allocate(event.size), event.size};
        requested += static_cast<std::int64_t>(event.size);
        result.peak_requested = std::max(result.peak_requested, requested);
        ++result.allocs;
        break;
      }
      case TraceOp::kFree: {
        auto it = live.find(event.addr);
        if (it == live.end()) continue;
        model.Free(it->second.first);
        requested -= static_cast<std::int64_t>(it->second.second);
        live.erase(it);
        break;
      }
      case TraceOp::kEmptyCache:
        model.EmptyCache();
        break;
      default:
        continue;
    }
    if (check) note(model.CheckInvariants());
  }
  if (free_survivors) {
    // In address order: the hash map's order changes from run to run, and the
    // order of frees decides which cached pages are stolen first.
    std::vector<std::uint64_t> survivors;
    for (const auto& [addr, block] : live) survivors.push_back(block.first);
    std::sort(survivors.begin(), survivors.end());
    for (const std::uint64_t address : survivors) model.Free(address);
    if (check) note(model.CheckInvariants());
  }
  return result;
}

std::string CallsJson(const ModelCounts& now, const ModelCounts& before, std::int64_t allocs) {
  auto per_1k = [&](std::int64_t value) {
    return allocs == 0 ? 0.0 : 1000.0 * static_cast<double>(value) / static_cast<double>(allocs);
  };
  return absl::StrFormat(
      "{\"allocs\": %d, \"creates_per_1k\": %.1f, \"maps_per_1k\": %.1f, "
      "\"unmaps_per_1k\": %.1f, \"set_access_per_1k\": %.1f, \"steals_per_1k\": %.1f, "
      "\"map_unmap_per_1k\": %.1f, \"cache_hit_fraction\": %.4f}",
      allocs, per_1k(now.creates - before.creates), per_1k(now.maps - before.maps),
      per_1k(now.unmaps - before.unmaps), per_1k(now.set_access - before.set_access),
      per_1k(now.steals - before.steals),
      per_1k(now.maps - before.maps + now.unmaps - before.unmaps),
      allocs == 0
          ? 0.0
          : static_cast<double>(now.cache_hits - before.cache_hits) / static_cast<double>(allocs));
}

std::string Study(const Trace& trace, const PolicyOptions& policy, const Options& options) {
  VmmPlacementModel model(policy);
  const PassResult first = ReplayPass(trace, model, options.check, true);
  const ModelCounts after_first = model.counts();
  PassResult warm;
  std::string error = first.error;
  for (int pass = 0; pass < options.warm_passes; ++pass) {
    PassResult one = ReplayPass(trace, model, options.check, true);
    warm.allocs += one.allocs;
    if (error.empty()) error = one.error;
  }
  const ModelCounts& end = model.counts();
  const std::int64_t page = static_cast<std::int64_t>(model.page_bytes());
  const std::int64_t peak_physical = after_first.peak_handles * page;
  std::string json = absl::StrFormat(
      "{\"trace\": \"%s\", \"policy\": \"%s\", \"allocs\": %d, \"peak_requested_bytes\": %d, "
      "\"peak_allocated_bytes\": %d, \"peak_physical_bytes\": %d, "
      "\"peak_requested_over_physical\": %.4f, \"warm_passes\": %d, "
      "\"warm_peak_physical_bytes\": %d, \"peak_address_space_bytes\": %d, "
      "\"first_pass\": %s, \"warm\": %s",
      trace.name, policy.Name(), first.allocs, first.peak_requested,
      after_first.peak_allocated_bytes, peak_physical,
      peak_physical == 0
          ? 0.0
          : static_cast<double>(first.peak_requested) / static_cast<double>(peak_physical),
      options.warm_passes, end.peak_handles * page, end.peak_extent_bytes,
      CallsJson(after_first, ModelCounts{}, first.allocs),
      CallsJson(end, after_first, warm.allocs));
  if (!error.empty()) absl::StrAppend(&json, ", \"invariant_error\": \"", error, "\"");
  return json + "}";
}

bool ParsePolicies(const std::string& text, std::vector<PolicyOptions>* out) {
  const std::vector<PolicyOptions> all = AllPolicies();
  if (text == "all") {
    *out = all;
    return true;
  }
  for (absl::string_view name : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    bool found = false;
    for (const PolicyOptions& policy : all) {
      if (policy.Name() == name) {
        out->push_back(policy);
        found = true;
      }
    }
    if (!found) {
      std::fprintf(stderr, "vmm_placement_study: unknown policy %s; known:\n",
                   std::string(name).c_str());
      for (const PolicyOptions& policy : all) std::fprintf(stderr, "  %s\n", policy.Name().c_str());
      return false;
    }
  }
  return true;
}

}  // namespace
}  // namespace vmm
}  // namespace torchmem_bench

int main(int argc, char** argv) {
  using torchmem_bench::vmm::Options;
  Options options;
  std::string policies = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--policies=", 0) == 0) {
      policies = arg.substr(11);
    } else if (arg.rfind("--warm_passes=", 0) == 0) {
      if (!absl::SimpleAtoi(arg.substr(14), &options.warm_passes) || options.warm_passes < 0) {
        std::fprintf(stderr, "vmm_placement_study: bad %s\n", arg.c_str());
        return 2;
      }
    } else if (arg == "--check") {
      options.check = true;
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr,
                   "usage: vmm_placement_study [--policies=all|NAME,...] [--warm_passes=N] "
                   "[--check] [PATH ...]\n");
      return arg == "--help" ? 0 : 2;
    } else {
      options.paths.push_back(arg);
    }
  }
  if (!torchmem_bench::vmm::ParsePolicies(policies, &options.policies)) return 2;
  if (options.paths.empty()) options.paths.push_back(torchmem_bench::TracesDirectory(""));
  int status = 0;
  for (const std::string& path : options.paths) {
    auto files = torchmem_bench::ListTraceFiles(path);
    if (!files.ok()) {
      std::fprintf(stderr, "vmm_placement_study: %s\n", files.status().ToString().c_str());
      status = 1;
      continue;
    }
    for (const std::string& file : *files) {
      auto trace = torchmem_bench::ReadTrace(file);
      if (!trace.ok()) {
        std::fprintf(stderr, "vmm_placement_study: %s\n", trace.status().ToString().c_str());
        status = 1;
        continue;
      }
      for (const auto& policy : options.policies) {
        std::printf("%s\n", torchmem_bench::vmm::Study(*trace, policy, options).c_str());
        std::fflush(stdout);
      }
    }
  }
  return status;
}
