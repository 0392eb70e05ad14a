// Engine benchmark: nanoseconds per alloc+free pair on cache hits.
//
// What it measures (Google Benchmark; every variant at 1 and 2 threads
// sharing one allocator, time = wall time / pairs done by all threads, i.e.
// the inverse of throughput):
//   engine/one_size/{plain,tag_scope}  Allocate(4 KiB) + Free, repeated: the
//       exact-size fast path.
//   engine/trace_mix/{plain,tag_scope} one Free + one Allocate per iteration,
//       sizes drawn from the traces' alloc sizes (see "The trace mix" below).
//   tag_scope: the benchmark thread has a tag pushed (PushTag) and a leak
//       scope open (OpenScope; closed with CloseLeakScope after timing), so
//       every block is stamped, charged to the tag and linked to the scope.
//   toy/...     the design's toy fast path: one std::mutex, an
//       absl::flat_hash_map from pointer to block and an exact-size LIFO per
//       rounded size (no splitting, no stats).
//   std_set/... a model of the containers of PyTorch's CUDACachingAllocator
//       before its stats, events and splitting: std::recursive_mutex, a
//       std::unordered_map from pointer to block and a best-fit
//       std::set<Block*> ordered by (stream, size, address).
// Every allocator hands out address ranges without memory (the engine runs
// over ControlledBackend), so working sets of many GiB cost nothing. Caches
// are warmed before timing; the "device_allocs" counter says how many backend
// segment allocations (toy models: new blocks) happened inside the timed
// loops, and should be 0.
//
// At the end two tables (real time, CPU time) give the median ns/pair of each
// variant and the ratios engine/toy, engine/std_set and tag_scope/plain.
//
// The trace mix. All alloc sizes of all *.csv traces in --traces_dir
// (default $TORCHMEM_TRACES_DIR, else /work/shared/traces), one entry per
// alloc row (so sizes are weighted by frequency), shuffled with a fixed seed.
// Each thread keeps a working set of kWorkingSet live blocks (the traces
// peak at 12..1290 live blocks, most training traces at 650..900); each
// iteration frees the block in a random slot of the working set and
// allocates the next size of the shuffled sample into that slot. Sizes and
// slots are precomputed (one period of ops, cycled), so no random number is
// drawn in the timed loop and the pool needed is the same in every period.
// Why this shape: replaying the traces themselves would mostly measure their
// cold start (segment allocation), while a fixed "alloc then free" of each
// size would only exercise the exact-size path. With a random victim, the
// size freed usually differs from the size allocated next, so the engine
// sees both exact-size hits (a parked block of that rounded size exists) and
// misses that go to best fit, split the block found, and, when no free block
// fits, merge the parked blocks into the tree - all without the backend once
// the pool has grown to the working set's needs (the warm-up runs periods
// of the whole sample until kCleanPasses in a row need no new segment; set
// TORCHMEM_BENCH_DEBUG=1 to see the misses of each warm-up period).
//
// Run:
//   cmake -S . -B build/bench -G Ninja -DCMAKE_BUILD_TYPE=Release
//     -DTORCHMEM_BUILD_PYTHON=OFF -DTORCHMEM_BUILD_CUDA=OFF
//     -DTORCHMEM_BUILD_SIMCUDA=OFF -DTORCHMEM_BUILD_TESTS=OFF   (one command)
//   cmake --build build/bench --target engine_benchmark
//   build/bench/benchmarks/engine_benchmark [--traces_dir=DIR] [benchmark flags]
// Defaults added before the command line (which overrides them):
//   --benchmark_min_time=0.5 --benchmark_repetitions=5
//   --benchmark_enable_random_interleaving=true
//   --benchmark_report_aggregates_only=true
// (Debian's Google Benchmark 1.7.1 reads min_time as seconds, without a unit.)
// Random interleaving runs the repetitions of all variants in random order,
// so slow phases of a noisy machine spread over all of them; medians are
// reported. Use --benchmark_filter=trace_mix to run a subset and
// --benchmark_out=FILE --benchmark_out_format=json for machine-readable
// output. The benchmark measures and prints; it asserts nothing about time.
//
// Profiling: under callgrind, only the timed loops are instrumented (client
// requests around them; warm-up runs uninstrumented), e.g.
//   valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=cg.out
//     build/bench/benchmarks/engine_benchmark --benchmark_repetitions=1
//     --benchmark_min_time=0.05
//     --benchmark_filter='engine/trace_mix/plain/real_time/threads:1$'
//   callgrind_annotate --inclusive=yes cg.out
// Instructions per pair = total Ir / iterations (the iterations of all the
// calls Google Benchmark made; TORCHMEM_BENCH_DEBUG=1 prints them).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define TORCHMEM_BENCH_PROFILE_START() CALLGRIND_START_INSTRUMENTATION
#define TORCHMEM_BENCH_PROFILE_STOP() CALLGRIND_STOP_INSTRUMENTATION
#else
#define TORCHMEM_BENCH_PROFILE_START() ((void)0)
#define TORCHMEM_BENCH_PROFILE_STOP() ((void)0)
#endif

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "doubles/controlled_backend.h"
#include "torchmem/core/attribution.h"
#include "torchmem/core/engine.h"
#include "trace_csv.h"

namespace torchmem_bench {
namespace {

using torchmem::Engine;

constexpr std::size_t kOneSize = 4096;
constexpr std::size_t kWorkingSet = 512;
// Warm-up: periods of the mix until kCleanPasses in a row need no new
// segment (the engine's pool creeps for ~80 periods: 49 segments in the
// first, then one every 5..25 periods until it stops), at most kMaxWarmupPasses.
constexpr int kCleanPasses = 30;
constexpr int kMaxWarmupPasses = 200;
constexpr std::uintptr_t kToyBaseAddress = std::uintptr_t{1} << 40;

std::string g_traces_dir;  // set from --traces_dir

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "engine_benchmark: %s\n", message.c_str());
  std::abort();
}

std::size_t RoundSize(std::size_t size) { return size < 512 ? 512 : (size + 511) / 512 * 512; }

// --- allocators under test ---------------------------------------------------

class EngineAllocator {
 public:
  EngineAllocator() {
    torchmem::ControlledBackendOptions options;
    options.device_name = "bench:0";
    options.capacity_bytes = std::size_t{1} << 50;  // address ranges only
    options.auto_complete_events = true;
    engine_ = std::make_unique<Engine>(std::make_unique<torchmem::ControlledBackend>(options));
  }
  void* Allocate(std::size_t size) {
    absl::StatusOr<void*> ptr = engine_->Allocate(size);
    if (ABSL_PREDICT_FALSE(!ptr.ok())) Die(ptr.status().ToString());
    return *ptr;
  }
  void Free(void* ptr) {
    absl::Status status = engine_->Free(ptr);
    if (ABSL_PREDICT_FALSE(!status.ok())) Die(status.ToString());
  }
  std::int64_t Misses() const { return engine_->GetStats().num_device_alloc; }

 private:
  std::unique_ptr<Engine> engine_;
};

// The toy fast path of DESIGN.md: one mutex, a flat_hash_map from pointer to
// block, an exact-size LIFO free list per rounded size.
class ToyAllocator {
 public:
  void* Allocate(std::size_t size) {
    const std::size_t rounded = RoundSize(size);
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<ToyBlock*>& list = free_[rounded];
    ToyBlock* block;
    if (ABSL_PREDICT_TRUE(!list.empty())) {
      block = list.back();
      list.pop_back();
    } else {
      ++misses_;
      block = &storage_.emplace_back(ToyBlock{next_address_, rounded});
      next_address_ += rounded;
    }
    live_.emplace(block->address, block);
    return reinterpret_cast<void*>(block->address);
  }
  void Free(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (ABSL_PREDICT_FALSE(it == live_.end())) Die("toy: unknown pointer");
    ToyBlock* block = it->second;
    live_.erase(it);
    free_[block->size].push_back(block);
  }
  std::int64_t Misses() {
    std::lock_guard<std::mutex> lock(mutex_);
    return misses_;
  }

 private:
  struct ToyBlock {
    std::uintptr_t address;
    std::size_t size;
  };
  std::mutex mutex_;
  absl::flat_hash_map<std::uintptr_t, ToyBlock*> live_;
  absl::flat_hash_map<std::size_t, std::vector<ToyBlock*>> free_;
  std::deque<ToyBlock> storage_;
  std::uintptr_t next_address_ = kToyBaseAddress;
  std::int64_t misses_ = 0;
};

// PyTorch's containers: BlockPool is a std::set<Block*> ordered by (stream,
// size, ptr); a free block of at least the rounded size is taken by
// lower_bound (no splitting here); the pointer map is a hash map; the
// allocator's lock is a std::recursive_mutex.
class StdSetAllocator {
 public:
  void* Allocate(std::size_t size) {
    const std::size_t rounded = RoundSize(size);
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    SetBlock key{kStream, rounded, 0};
    auto it = pool_.lower_bound(&key);
    SetBlock* block;
    if (ABSL_PREDICT_TRUE(it != pool_.end() && (*it)->stream == kStream)) {
      block = *it;
      pool_.erase(it);
    } else {
      ++misses_;
      block = &storage_.emplace_back(SetBlock{kStream, rounded, next_address_});
      next_address_ += rounded;
    }
    allocated_.emplace(block->address, block);
    return reinterpret_cast<void*>(block->address);
  }
  void Free(void* ptr) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    auto it = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (ABSL_PREDICT_FALSE(it == allocated_.end())) Die("std_set: unknown pointer");
    SetBlock* block = it->second;
    allocated_.erase(it);
    pool_.insert(block);
  }
  std::int64_t Misses() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return misses_;
  }

 private:
  static constexpr std::uintptr_t kStream = 0;
  struct SetBlock {
    std::uintptr_t stream;
    std::size_t size;
    std::uintptr_t address;
  };
  struct Comparison {  // PyTorch's BlockComparatorSize
    bool operator()(const SetBlock* a, const SetBlock* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->address < b->address;
    }
  };
  std::recursive_mutex mutex_;
  std::unordered_map<std::uintptr_t, SetBlock*> allocated_;
  std::set<SetBlock*, Comparison> pool_;
  std::deque<SetBlock> storage_;
  std::uintptr_t next_address_ = kToyBaseAddress;
  std::int64_t misses_ = 0;
};

// --- the trace mix -----------------------------------------------------------

// One step of the mix: free the block in `slot`, allocate `size` into it.
struct MixOp {
  std::size_t size;
  std::uint32_t slot;
};

struct TraceMix {
  // One period: one op per alloc row of the traces, in shuffled order. Every
  // slot is overwritten many times per period, so the set of live sizes is
  // the same at every period boundary and a warm pool stays warm.
  std::vector<MixOp> ops;
  std::size_t traces = 0;
  std::size_t distinct = 0;
  std::string error;  // non-empty: no mix available
};

const TraceMix& GetTraceMix() {
  static const TraceMix* mix = [] {
    auto* result = new TraceMix;
    const std::string dir = TracesDirectory(g_traces_dir);
    absl::StatusOr<std::vector<std::string>> files = ListTraceFiles(dir);
    if (!files.ok()) {
      result->error = files.status().ToString();
      return result;
    }
    std::vector<std::size_t> sizes;
    for (const std::string& file : *files) {
      absl::StatusOr<Trace> trace = ReadTrace(file);
      if (!trace.ok()) {
        result->error = trace.status().ToString();
        return result;
      }
      ++result->traces;
      for (const TraceEvent& event : trace->events) {
        if (event.op == TraceOp::kAlloc && event.size > 0 &&
            event.size <= Engine::kMaxRequestBytes) {
          sizes.push_back(event.size);
        }
      }
    }
    if (sizes.empty()) {
      result->error = absl::StrFormat("no alloc rows in any *.csv of %s", dir);
      return result;
    }
    result->distinct = std::set<std::size_t>(sizes.begin(), sizes.end()).size();
    std::mt19937_64 rng(20240611);
    std::shuffle(sizes.begin(), sizes.end(), rng);
    std::uniform_int_distribution<std::uint32_t> slot(0, kWorkingSet - 1);
    result->ops.reserve(sizes.size());
    for (std::size_t size : sizes) result->ops.push_back(MixOp{size, slot(rng)});
    return result;
  }();
  return *mix;
}

// --- fixtures ------------------------------------------------------------------

// One benchmark thread's working set and positions in the mix.
struct ThreadRing {
  std::vector<void*> live;
  std::size_t pos = 0;  // next op of the mix
};

// An allocator kept warm across the calls Google Benchmark makes while it
// picks an iteration count and across repetitions: one per variant and
// thread count.
template <typename Allocator>
struct Fixture {
  std::string key;
  Allocator allocator;
  std::vector<ThreadRing> rings;
};

enum class Workload { kOneSize, kTraceMix };

// One trace-mix step of `ring`: free a random slot, allocate the next size.
template <typename Allocator>
inline void MixStep(Allocator& allocator, ThreadRing& ring, const TraceMix& mix) {
  const MixOp& op = mix.ops[ring.pos];
  if (++ring.pos == mix.ops.size()) ring.pos = 0;
  allocator.Free(ring.live[op.slot]);
  ring.live[op.slot] = allocator.Allocate(op.size);
}

// Builds and warms the fixture for `threads` threads (called by thread 0
// before the start barrier, so no other thread touches it meanwhile).
template <typename Allocator>
Fixture<Allocator>* PrepareFixture(const std::string& key, Workload workload, int threads) {
  // Kept for the whole run (random interleaving comes back to each variant
  // once per repetition); leaked at exit like the torch glue's engines.
  static auto* fixtures = new std::map<std::string, std::unique_ptr<Fixture<Allocator>>>;
  std::unique_ptr<Fixture<Allocator>>& current = (*fixtures)[key];
  if (current != nullptr) return current.get();
  current = std::make_unique<Fixture<Allocator>>();
  current->key = key;
  current->rings.resize(threads);
  if (workload == Workload::kOneSize) {
    void* ptr = current->allocator.Allocate(kOneSize);
    current->allocator.Free(ptr);
    return current.get();
  }
  const TraceMix& mix = GetTraceMix();
  for (int t = 0; t < threads; ++t) {
    ThreadRing& ring = current->rings[t];
    ring.pos = mix.ops.size() * t / threads;
    ring.live.resize(kWorkingSet);
    for (std::size_t i = 0; i < kWorkingSet; ++i) {
      ring.live[i] = current->allocator.Allocate(mix.ops[(ring.pos + i) % mix.ops.size()].size);
    }
  }
  // Warm up: whole periods of the mix (threads interleaved in steps of 64
  // ops), until kCleanPasses periods in a row need no new segment. The
  // engine's pool keeps growing for a while after the first period (free
  // space drifts into shapes that a later period cannot use).
  int clean_passes = 0;
  for (int pass = 0; pass < kMaxWarmupPasses && clean_passes < kCleanPasses; ++pass) {
    const std::int64_t misses_before = current->allocator.Misses();
    for (std::size_t done = 0; done < mix.ops.size(); done += 64) {
      const std::size_t steps = std::min<std::size_t>(64, mix.ops.size() - done);
      for (int t = 0; t < threads; ++t) {
        for (std::size_t i = 0; i < steps; ++i) {
          MixStep(current->allocator, current->rings[t], mix);
        }
      }
    }
    const std::int64_t misses = current->allocator.Misses() - misses_before;
    if (std::getenv("TORCHMEM_BENCH_DEBUG") != nullptr) {
      std::fprintf(stderr, "%s warm-up pass %d: %lld misses\n", key.c_str(), pass,
                   static_cast<long long>(misses));
    }
    clean_passes = misses == 0 ? clean_passes + 1 : 0;
  }
  return current.get();
}

template <typename Allocator>
void RunPairs(benchmark::State& state, const std::string& name, Workload workload, bool tag_scope) {
  if (workload == Workload::kTraceMix && !GetTraceMix().error.empty()) {
    state.SkipWithError(("no trace mix: " + GetTraceMix().error).c_str());
    for (auto _ : state) {
    }
    return;
  }
  static Fixture<Allocator>* fixture = nullptr;  // published by thread 0
  std::int64_t misses_before = 0;
  if (state.thread_index() == 0) {
    fixture = PrepareFixture<Allocator>(absl::StrFormat("%s/%d", name, state.threads()), workload,
                                        state.threads());
    misses_before = fixture->allocator.Misses();
  }
  torchmem::TagId tag = torchmem::kNoTag;
  torchmem::ScopeId scope = torchmem::kNoScope;
  if (tag_scope) {
    tag = *torchmem::TagRegistry::Intern(absl::StrFormat("bench_thread_%d", state.thread_index()));
    if (absl::Status pushed = torchmem::PushTag(tag); !pushed.ok()) Die(pushed.ToString());
    scope = torchmem::OpenScope();
  }

  TORCHMEM_BENCH_PROFILE_START();  // no-op unless run under callgrind
  if (workload == Workload::kOneSize) {
    for (auto _ : state) {
      void* ptr = fixture->allocator.Allocate(kOneSize);
      benchmark::DoNotOptimize(ptr);
      fixture->allocator.Free(ptr);
    }
  } else {
    const TraceMix& mix = GetTraceMix();
    for (auto _ : state) {
      // The barrier at the start of the loop published `fixture`.
      MixStep(fixture->allocator, fixture->rings[state.thread_index()], mix);
    }
  }
  TORCHMEM_BENCH_PROFILE_STOP();

  if (tag_scope) {
    absl::StatusOr<std::vector<torchmem::ScopeSurvivors>> survivors =
        torchmem::CloseLeakScope(scope);
    if (!survivors.ok()) Die(survivors.status().ToString());
    if (absl::Status popped = torchmem::PopTag(tag); !popped.ok()) Die(popped.ToString());
  }
  if (state.thread_index() == 0) {
    // All threads passed the barrier at the end of the loop.
    state.counters["device_allocs"] =
        static_cast<double>(fixture->allocator.Misses() - misses_before);
    if (std::getenv("TORCHMEM_BENCH_DEBUG") != nullptr) {
      std::fprintf(stderr, "%s/%d: timed loop of %lld iterations\n", name.c_str(), state.threads(),
                   static_cast<long long>(state.iterations()));
    }
    if (workload == Workload::kTraceMix) {
      state.SetLabel(absl::StrFormat("%d sizes from %d traces, %d live/thread",
                                     GetTraceMix().distinct, GetTraceMix().traces, kWorkingSet));
    }
  }
}

// --- ratio table ---------------------------------------------------------------

// Prints the usual console output, remembers each variant's median (or only)
// real and CPU time per iteration, and prints the ratio tables at the end.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  using ConsoleReporter::ConsoleReporter;

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    if (runs.empty()) return;
    std::vector<double> real;
    std::vector<double> cpu;
    const Run* median = nullptr;
    for (const Run& run : runs) {
      if (run.error_occurred) return;
      if (run.run_type == Run::RT_Aggregate) {
        if (run.aggregate_name == "median") median = &run;
      } else {
        real.push_back(Nanoseconds(run, run.GetAdjustedRealTime()));
        cpu.push_back(Nanoseconds(run, run.GetAdjustedCPUTime()));
      }
    }
    Times times;
    if (median != nullptr) {
      times.real = Nanoseconds(*median, median->GetAdjustedRealTime());
      times.cpu = Nanoseconds(*median, median->GetAdjustedCPUTime());
    } else if (!real.empty()) {
      times.real = Median(real);
      times.cpu = Median(cpu);
    } else {
      return;
    }
    const Run& any = runs.front();
    times_[{any.run_name.function_name, static_cast<int>(any.threads)}] = times;
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::ostream& out = GetOutputStream();
    PrintTable(out, "real", &Times::real,
               "wall time / pairs done by all threads: the inverse of throughput");
    PrintTable(out, "cpu", &Times::cpu,
               "CPU time of all threads / pairs: less sensitive to a busy machine");
    out.flush();
  }

 private:
  struct Times {
    double real = -1.0;
    double cpu = -1.0;
  };

  static double Nanoseconds(const Run& run, double value) {
    return value / benchmark::GetTimeUnitMultiplier(run.time_unit) * 1e9;
  }
  static double Median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
  }

  void PrintTable(std::ostream& out, const char* kind, double Times::*field,
                  const char* meaning) const {
    out << absl::StrFormat(
        "\nns per alloc+free pair, %s time (median; %s)\n"
        "%-10s %7s %9s %11s %9s %9s %11s %15s %10s\n",
        kind, meaning, "workload", "threads", "engine", "engine+tag", "toy", "std_set",
        "engine/toy", "engine/std_set", "tag/plain");
    for (const char* workload : {"one_size", "trace_mix"}) {
      for (int threads : {1, 2}) {
        const std::string w = workload;
        const double engine = Get("engine/" + w + "/plain", threads, field);
        const double tagged = Get("engine/" + w + "/tag_scope", threads, field);
        const double toy = Get("toy/" + w, threads, field);
        const double std_set = Get("std_set/" + w, threads, field);
        if (engine < 0 && tagged < 0 && toy < 0 && std_set < 0) continue;
        out << absl::StrFormat("%-10s %7d %9s %11s %9s %9s %11s %15s %10s\n", workload, threads,
                               Format(engine), Format(tagged), Format(toy), Format(std_set),
                               Ratio(engine, toy), Ratio(engine, std_set), Ratio(tagged, engine));
      }
    }
  }
  double Get(const std::string& name, int threads, double Times::*field) const {
    auto it = times_.find({name, threads});
    return it == times_.end() ? -1.0 : it->second.*field;
  }
  static std::string Format(double ns) { return ns < 0 ? "-" : absl::StrFormat("%.1f", ns); }
  static std::string Ratio(double a, double b) {
    return a < 0 || b <= 0 ? "-" : absl::StrFormat("%.2f", a / b);
  }

  std::map<std::pair<std::string, int>, Times> times_;
};

template <typename Allocator>
void Register(const std::string& name, Workload workload, bool tag_scope) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [name, workload, tag_scope](benchmark::State& state) {
                                 RunPairs<Allocator>(state, name, workload, tag_scope);
                               })
      ->Threads(1)
      ->Threads(2)
      ->UseRealTime();
}

void RegisterAll() {
  for (Workload workload : {Workload::kOneSize, Workload::kTraceMix}) {
    const std::string w = workload == Workload::kOneSize ? "one_size" : "trace_mix";
    Register<EngineAllocator>("engine/" + w + "/plain", workload, false);
    Register<EngineAllocator>("engine/" + w + "/tag_scope", workload, true);
    Register<ToyAllocator>("toy/" + w, workload, false);
    Register<StdSetAllocator>("std_set/" + w, workload, false);
  }
}

}  // namespace
}  // namespace torchmem_bench

int main(int argc, char** argv) {
  // Our flag first; then defaults that the command line may override.
  std::vector<char*> args = {argv[0]};
  static char kDefaults[][64] = {
      "--benchmark_min_time=0.5",
      "--benchmark_repetitions=5",
      "--benchmark_enable_random_interleaving=true",
      "--benchmark_report_aggregates_only=true",
  };
  for (char* flag : kDefaults) args.push_back(flag);
  const std::string traces_flag = "--traces_dir=";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind(traces_flag, 0) == 0) {
      torchmem_bench::g_traces_dir = arg.substr(traces_flag.size());
    } else {
      args.push_back(argv[i]);
    }
  }
  int new_argc = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&new_argc, args.data());
  if (benchmark::ReportUnrecognizedArguments(new_argc, args.data())) return 1;
  torchmem_bench::RegisterAll();
  torchmem_bench::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
