// Test support: the simulated CUDA device's control API (tests/simcuda),
// looked up at run time in the preloaded runtime.
//
// Test programs link NVIDIA's shared libcudart and CTest preloads the
// simulated one; resolving simcuda_* with dlsym (rather than linking it)
// keeps the program runnable against either, and makes a missing preload
// fail with a message that says what to do.
#ifndef TORCHMEM_TESTS_CPP_SUPPORT_SIMCUDA_API_H_
#define TORCHMEM_TESTS_CPP_SUPPORT_SIMCUDA_API_H_

#include <dlfcn.h>

#include "gtest/gtest.h"

namespace torchmem::testing {

inline constexpr int kSimCudaManualEvents = 1;  // SIMCUDA_EVENT_MODE_MANUAL

struct SimCuda {
  int (*set_memory_capacity)(int device, unsigned long long bytes);
  unsigned long long (*live_bytes)(int device);
  int (*set_event_mode)(int mode);
  int (*complete_stream)(void* stream);
  int (*complete_all)();
  int (*fail_next)(const char* call, unsigned long long count, int error);
  int (*inject_fault)(const char* call, unsigned long long skip, unsigned long long count,
                      int error);
  void (*clear_faults)();
  unsigned long long (*call_count)(const char* call);
  void (*reset)();

  static const SimCuda& Get() {
    static const SimCuda api = [] {
      SimCuda s{};
      Resolve(s.set_memory_capacity, "simcuda_set_memory_capacity");
      Resolve(s.live_bytes, "simcuda_live_bytes");
      Resolve(s.set_event_mode, "simcuda_set_event_mode");
      Resolve(s.complete_stream, "simcuda_complete_stream");
      Resolve(s.complete_all, "simcuda_complete_all");
      Resolve(s.fail_next, "simcuda_fail_next");
      Resolve(s.inject_fault, "simcuda_inject_fault");
      Resolve(s.clear_faults, "simcuda_clear_faults");
      Resolve(s.call_count, "simcuda_call_count");
      Resolve(s.reset, "simcuda_reset");
      return s;
    }();
    return api;
  }

 private:
  template <typename Fn>
  static void Resolve(Fn& fn, const char* name) {
    void* symbol = dlsym(RTLD_DEFAULT, name);
    if (symbol == nullptr) {
      ADD_FAILURE() << name << " not found: run this test with tests/simcuda's libcudart.so.13 "
                    << "and libcuda.so.1 in LD_PRELOAD (ctest does this)";
    }
    fn = reinterpret_cast<Fn>(symbol);
  }
};

}  // namespace torchmem::testing

#endif  // TORCHMEM_TESTS_CPP_SUPPORT_SIMCUDA_API_H_
