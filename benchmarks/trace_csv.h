// Reading allocation traces in the CSV format of ../shared/traces (see its
// README): a header line naming the columns `op,addr,size,stream` (any order,
// extra columns ignored), then one event per line:
//
//   op,addr,size,stream
//   alloc,34135343104,2097152,0
//   free,34135343104,2097152,0
//
// `op` is one of alloc, free, segment_alloc, segment_free, empty_cache, oom;
// the numbers are unsigned decimal integers. Blank lines, trailing carriage
// returns and surrounding spaces are tolerated; a file without a header is
// read in the default column order. An unknown op is kept as kUnknown (a
// replayer counts and skips it) so that a newer trace still replays; a
// malformed number is an error naming the file and line.
//
// Used by the trace-mix benchmark (engine_benchmark.cc) and the replay tool
// (trace_replay.cc).
#ifndef TORCHMEM_BENCHMARKS_TRACE_CSV_H_
#define TORCHMEM_BENCHMARKS_TRACE_CSV_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace torchmem_bench {

enum class TraceOp : std::uint8_t {
  kAlloc,
  kFree,
  kSegmentAlloc,
  kSegmentFree,
  kEmptyCache,
  kOom,
  kUnknown,
};

struct TraceEvent {
  TraceOp op = TraceOp::kUnknown;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
};

struct Trace {
  std::string path;
  std::string name;  // file name without directory and ".csv"
  std::vector<TraceEvent> events;
};

// Reads one trace file.
absl::StatusOr<Trace> ReadTrace(const std::string& path);

// The paths of `path` if it is a file, or of every `*.csv` file directly in
// it if it is a directory, sorted by name.
absl::StatusOr<std::vector<std::string>> ListTraceFiles(const std::string& path);

// The traces directory: `flag_value` if not empty, else $TORCHMEM_TRACES_DIR,
// else /work/shared/traces.
std::string TracesDirectory(const std::string& flag_value);

}  // namespace torchmem_bench

#endif  // TORCHMEM_BENCHMARKS_TRACE_CSV_H_
