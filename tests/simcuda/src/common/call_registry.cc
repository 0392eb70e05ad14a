// Call counters, fault rules, the unsupported-call notice and the exit-time
// trace of the simulated CUDA libraries (see call_registry.h).
#include "common/call_registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#ifndef SIMCUDA_LIBRARY_LABEL
#error "SIMCUDA_LIBRARY_LABEL must name the library (runtime or driver)"
#endif

namespace simcuda {
namespace {

struct FaultRule {
  uint64_t skip;
  uint64_t count;
  int error;
};

struct Registry {
  std::mutex mu;
  std::map<std::string, CallSite*> sites;  // never erased, never freed
  std::map<std::string, std::deque<FaultRule>> faults;
};

// Leaked on purpose: calls can arrive from other libraries' static
// destructors after ours would have run.
Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

CallSite* FindOrCreateLocked(Registry& r, const std::string& name) {
  auto it = r.sites.find(name);
  if (it != r.sites.end()) return it->second;
  CallSite* site = new CallSite(name);
  r.sites.emplace(name, site);
  return site;
}

}  // namespace

int CallSite::Hit() {
  count.fetch_add(1, std::memory_order_relaxed);
  modelled_ns.fetch_add(cost_ns.load(std::memory_order_relaxed), std::memory_order_relaxed);
  if (!fault_armed.load(std::memory_order_acquire)) return 0;
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.faults.find(name);
  if (it == r.faults.end() || it->second.empty()) return 0;
  FaultRule& rule = it->second.front();
  int error = 0;
  if (rule.skip > 0) {
    --rule.skip;
  } else {
    error = rule.error;
    if (--rule.count == 0) it->second.pop_front();
  }
  if (it->second.empty()) {
    r.faults.erase(it);
    fault_armed.store(false, std::memory_order_release);
  }
  return error;
}

CallSite* RegisterCall(const char* name) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  return FindOrCreateLocked(r, name);
}

uint64_t CallCount(const char* name) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.sites.find(name);
  if (it == r.sites.end()) return 0;
  return it->second->count.load() - it->second->count_at_reset.load();
}

void ResetCallCounts() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& entry : r.sites) {
    entry.second->count_at_reset.store(entry.second->count.load());
    entry.second->modelled_ns_at_reset.store(entry.second->modelled_ns.load());
  }
}

uint64_t ModelledNs(const std::string& name) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  uint64_t total = 0;
  for (const auto& entry : r.sites) {
    if (!name.empty() && entry.first != name) continue;
    total += entry.second->modelled_ns.load() - entry.second->modelled_ns_at_reset.load();
  }
  return total;
}

uint64_t SynchronizingCalls() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  uint64_t total = 0;
  for (const auto& entry : r.sites) {
    if (!entry.second->synchronizing) continue;
    total += entry.second->count.load() - entry.second->count_at_reset.load();
  }
  return total;
}

void SetCallCost(const char* name, uint64_t ns) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  FindOrCreateLocked(r, name)->cost_ns.store(ns);
}

void ArmFault(const char* name, uint64_t skip, uint64_t count, int error) {
  if (count == 0) return;
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.faults[name].push_back(FaultRule{skip, count, error});
  FindOrCreateLocked(r, name)->fault_armed.store(true, std::memory_order_release);
}

void ClearFaults() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.faults.clear();
  for (auto& entry : r.sites) entry.second->fault_armed.store(false);
}

bool ArmFaultsFromSpec(const char* spec, bool (*accept)(const std::string&),
                       int (*error_by_name)(const std::string&), int default_error) {
  // Grammar: rule (';' | ',') rule ...; rule = name (':' key '=' value)*;
  // keys: nth=N (fail the Nth call from now), next=K (fail the next K calls),
  // skip=S and count=C (general form), error=CODE|NAME.
  std::string all(spec);
  std::replace(all.begin(), all.end(), ',', ';');
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(';', start);
    if (end == std::string::npos) end = all.size();
    std::string rule = all.substr(start, end - start);
    start = end + 1;
    if (rule.empty()) continue;
    std::vector<std::string> fields;
    size_t f = 0;
    while (f <= rule.size()) {
      size_t colon = rule.find(':', f);
      if (colon == std::string::npos) colon = rule.size();
      fields.push_back(rule.substr(f, colon - f));
      f = colon + 1;
    }
    uint64_t skip = 0, count = 1;
    int error = default_error;
    for (size_t i = 1; i < fields.size(); ++i) {
      size_t eq = fields[i].find('=');
      if (eq == std::string::npos) {
        std::fprintf(stderr, "simcuda: bad SIMCUDA_FAULTS field '%s'\n", fields[i].c_str());
        return false;
      }
      std::string key = fields[i].substr(0, eq), value = fields[i].substr(eq + 1);
      char* value_end = nullptr;
      unsigned long long number = std::strtoull(value.c_str(), &value_end, 0);
      bool numeric = !value.empty() && *value_end == '\0';
      if (key == "error") {
        error = numeric ? static_cast<int>(number) : error_by_name(value);
        if (error < 0) {
          std::fprintf(stderr, "simcuda: unknown error '%s' in SIMCUDA_FAULTS\n", value.c_str());
          return false;
        }
      } else if (numeric && key == "nth" && number > 0) {
        skip = number - 1;
        count = 1;
      } else if (numeric && key == "next") {
        skip = 0;
        count = number;
      } else if (numeric && key == "skip") {
        skip = number;
      } else if (numeric && key == "count") {
        count = number;
      } else {
        std::fprintf(stderr, "simcuda: bad SIMCUDA_FAULTS field '%s'\n", fields[i].c_str());
        return false;
      }
    }
    if (accept(fields[0])) ArmFault(fields[0].c_str(), skip, count, error);
  }
  return true;
}

bool IsDriverCallName(const std::string& name) {
  return name.rfind("cu", 0) == 0 && name.rfind("cuda", 0) != 0;
}

void ReportUnsupported(CallSite* site) {
  if (!site->unsupported.exchange(true)) {
    std::fprintf(stderr, "simcuda: unsupported %s\n", site->name.c_str());
  }
}

bool WriteTrace(const char* path) {
  std::string text;
  {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& entry : r.sites) {
      uint64_t n = entry.second->count.load();
      if (n == 0) continue;
      text += SIMCUDA_LIBRARY_LABEL " " + entry.first + " " + std::to_string(n);
      if (entry.second->unsupported.load()) text += " unsupported";
      text += "\n";
    }
  }
  if (text.empty()) return true;
  std::string file(path);
  size_t pid_at = file.find("%p");
  if (pid_at != std::string::npos) file.replace(pid_at, 2, std::to_string(getpid()));
  // One write() in append mode, so the runtime's and the driver's reports (and
  // those of child processes) do not interleave.
  int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  ssize_t written = write(fd, text.data(), text.size());
  close(fd);
  return written == static_cast<ssize_t>(text.size());
}

bool ParseBytes(const char* text, uint64_t* bytes) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  if (end == text || value < 0) return false;
  std::string unit(end);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::pair<const char*, double> kUnits[] = {{"", 1.0},
                                                          {"B", 1.0},
                                                          {"K", 1024.0},
                                                          {"KB", 1024.0},
                                                          {"KIB", 1024.0},
                                                          {"M", 1048576.0},
                                                          {"MB", 1048576.0},
                                                          {"MIB", 1048576.0},
                                                          {"G", 1073741824.0},
                                                          {"GB", 1073741824.0},
                                                          {"GIB", 1073741824.0},
                                                          {"T", 1099511627776.0},
                                                          {"TB", 1099511627776.0},
                                                          {"TIB", 1099511627776.0}};
  for (const auto& u : kUnits) {
    if (unit == u.first) {
      *bytes = static_cast<uint64_t>(value * u.second);
      return true;
    }
  }
  return false;
}

namespace {
// Writes the trace when the library is unloaded (process exit). A destructor
// of this library rather than atexit(): the fake runtime is loaded first, so
// it is finalised after the libraries that call it.
__attribute__((destructor)) void WriteTraceAtExit() {
  const char* path = std::getenv("SIMCUDA_TRACE");
  if (path != nullptr && *path != '\0' && !WriteTrace(path)) {
    std::fprintf(stderr, "simcuda: cannot write SIMCUDA_TRACE file %s\n", path);
  }
}
}  // namespace

}  // namespace simcuda
