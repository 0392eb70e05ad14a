// Test support: an engine over a ControlledBackend wrapped in a
// FaultInjectingBackend (so a test can make any backend call fail), and the
// invariant check that every test runs after touching the pool.
#ifndef TORCHMEM_TESTS_CPP_SUPPORT_ENGINE_FIXTURE_H_
#define TORCHMEM_TESTS_CPP_SUPPORT_ENGINE_FIXTURE_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "doubles/controlled_backend.h"
#include "doubles/fault_injecting_backend.h"
#include "gtest/gtest.h"
#include "torchmem/core/engine.h"
#include "torchmem/core/warnings.h"

namespace torchmem::testing {

// Asserts that the engine's pool is intact (see Engine::CheckInvariants).
#define EXPECT_POOL_INTACT(engine)                          \
  do {                                                      \
    absl::Status _invariants = (engine).CheckInvariants();  \
    EXPECT_TRUE(_invariants.ok()) << _invariants.message(); \
  } while (0)

class EngineTest : public ::testing::Test {
 protected:
  explicit EngineTest(ControlledBackendOptions backend_options = {},
                      EngineOptions engine_options = {}) {
    auto backend = std::make_unique<ControlledBackend>(backend_options);
    backend_ = backend.get();
    auto faults = std::make_unique<FaultInjectingBackend>(std::move(backend));
    faults_ = faults.get();
    engine_ = std::make_unique<Engine>(std::move(faults), engine_options);
  }

  void TearDown() override {
    EXPECT_POOL_INTACT(*engine_);
    SetWarningHandler(nullptr);
    Warnings().clear();
  }

  // Starts collecting the engine's warnings (see Warnings()) for this test.
  static void CaptureWarnings() {
    Warnings().clear();
    SetWarningHandler([](absl::string_view message) { Warnings().emplace_back(message); });
  }
  static std::vector<std::string>& Warnings() {
    static std::vector<std::string>* warnings = new std::vector<std::string>;
    return *warnings;
  }

  void* Allocate(std::size_t size, StreamId stream = 0) {
    absl::StatusOr<void*> ptr = engine_->Allocate(size, stream);
    EXPECT_TRUE(ptr.ok()) << ptr.status().message();
    return ptr.ok() ? *ptr : nullptr;
  }
  void Free(void* ptr) {
    absl::Status status = engine_->Free(ptr);
    EXPECT_TRUE(status.ok()) << status.message();
  }
  MemoryStats Stats() const { return engine_->GetStats(); }
  static std::uintptr_t Address(void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

  ControlledBackend* backend_;     // owned by faults_
  FaultInjectingBackend* faults_;  // owned by engine_
  std::unique_ptr<Engine> engine_;
};

}  // namespace torchmem::testing

#endif  // TORCHMEM_TESTS_CPP_SUPPORT_ENGINE_FIXTURE_H_
