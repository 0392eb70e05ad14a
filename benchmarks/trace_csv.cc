// Reading allocation traces in the CSV format of ../shared/traces; see
// trace_csv.h.
#include "trace_csv.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace torchmem_bench {
namespace {

TraceOp ParseOp(absl::string_view op) {
  if (op == "alloc") return TraceOp::kAlloc;
  if (op == "free") return TraceOp::kFree;
  if (op == "segment_alloc") return TraceOp::kSegmentAlloc;
  if (op == "segment_free") return TraceOp::kSegmentFree;
  if (op == "empty_cache") return TraceOp::kEmptyCache;
  if (op == "oom") return TraceOp::kOom;
  return TraceOp::kUnknown;
}

bool IsKnownOp(absl::string_view field) { return ParseOp(field) != TraceOp::kUnknown; }

// Column positions of op, addr, size and stream.
struct Columns {
  int op = 0;
  int addr = 1;
  int size = 2;
  int stream = 3;
  int needed() const { return std::max({op, addr, size, stream}) + 1; }
};

}  // namespace

absl::StatusOr<Trace> ReadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot open trace %s", path));
  Trace trace;
  trace.path = path;
  trace.name = std::filesystem::path(path).stem().string();

  Columns columns;
  bool first = true;
  std::string line;
  std::vector<absl::string_view> fields;
  for (int line_number = 1; std::getline(in, line); ++line_number) {
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty()) continue;
    fields = absl::StrSplit(text, ',');
    for (absl::string_view& field : fields) field = absl::StripAsciiWhitespace(field);
    if (first) {
      first = false;
      if (!IsKnownOp(fields[0])) {
        // A header: find our columns by name.
        Columns named{-1, -1, -1, -1};
        for (int i = 0; i < static_cast<int>(fields.size()); ++i) {
          if (fields[i] == "op") named.op = i;
          if (fields[i] == "addr") named.addr = i;
          if (fields[i] == "size") named.size = i;
          if (fields[i] == "stream") named.stream = i;
        }
        if (named.op < 0 || named.addr < 0 || named.size < 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s:1: header must name the columns op, addr, size (and stream): %s", path, text));
        }
        columns = named;
        continue;
      }
    }
    const int needed = columns.stream < 0 ? std::max({columns.op, columns.addr, columns.size}) + 1
                                          : columns.needed();
    if (static_cast<int>(fields.size()) < needed) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d: expected at least %d comma-separated fields: %s", path,
                          line_number, needed, text));
    }
    TraceEvent event;
    event.op = ParseOp(fields[columns.op]);
    const bool numbers_ok =
        absl::SimpleAtoi(fields[columns.addr], &event.addr) &&
        absl::SimpleAtoi(fields[columns.size], &event.size) &&
        (columns.stream < 0 || absl::SimpleAtoi(fields[columns.stream], &event.stream));
    if (!numbers_ok) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d: addr, size and stream must be unsigned decimal integers: %s",
                          path, line_number, text));
    }
    trace.events.push_back(event);
  }
  if (in.bad()) return absl::DataLossError(absl::StrFormat("error reading %s", path));
  return trace;
}

absl::StatusOr<std::vector<std::string>> ListTraceFiles(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) {
    if (!std::filesystem::exists(path, error)) {
      return absl::NotFoundError(absl::StrFormat("no such trace file or directory: %s", path));
    }
    return std::vector<std::string>{path};
  }
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(path, error)) {
    if (entry.is_regular_file() && entry.path().extension() == ".csv") {
      files.push_back(entry.path().string());
    }
  }
  if (error) {
    return absl::UnavailableError(absl::StrFormat("cannot list %s: %s", path, error.message()));
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string TracesDirectory(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (const char* env = std::getenv("TORCHMEM_TRACES_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  // The full set beside the repository when it is there, else the samples
  // checked in under benchmarks/traces (TORCHMEM_SAMPLE_TRACES_DIR, set by CMake).
  if (std::filesystem::is_directory("/work/shared/traces")) return "/work/shared/traces";
  return TORCHMEM_SAMPLE_TRACES_DIR;
}

}  // namespace torchmem_bench
