#include "torchmem/torch/cuda/traceback_contexts.h"

#include <Python.h>

#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/profiler/combined_traceback.h>

#include "torchmem/core/context_capture.h"
#include "torchmem/torch/cuda/history_contexts.h"
#include "torchmem/torch/torch_version.h"

namespace torchmem::torch_glue {
namespace {

using PyFrame = torch::CapturedTraceback::PyFrame;

// The frames the next gather() on this thread hands over (set only while
// ContextFor builds a context).
thread_local std::vector<PyFrame>* t_handover = nullptr;

bool InterpreterAlive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

std::string Utf8(PyObject* text) {
  if (text == nullptr || !PyUnicode_Check(text)) return "?";
  const char* utf8 = PyUnicode_AsUTF8(text);
  if (utf8 == nullptr) {  // e.g. lone surrogates in a file name
    PyErr_Clear();
    return "?";
  }
  return utf8;
}

class TorchmemUnwinder final : public torch::CapturedTraceback::Python {
 public:
#if TORCHMEM_TORCH_VERSION_AT_LEAST(2, 11)  // asked before gather() since 2.11
  bool canGather() override { return t_handover != nullptr; }
#endif

  std::vector<PyFrame> gather() override {
    std::vector<PyFrame> frames;
    if (t_handover != nullptr) frames.swap(*t_handover);
    return frames;  // the references taken by ContextFor move with them
  }

  void release(std::vector<PyFrame>& frames) override {
    if (frames.empty() || !InterpreterAlive()) return;  // leaked at exit, harmlessly
    const PyGILState_STATE gil = PyGILState_Ensure();
    for (PyFrame& frame : frames) Py_XDECREF(static_cast<PyObject*>(frame.code));
    frames.clear();
    PyGILState_Release(gil);
  }

  void appendSymbolized(const std::vector<PyFrame>& to_symbolize,
                        torch::SymbolizedTracebacks& st) override {
    const PyGILState_STATE gil = PyGILState_Ensure();
    // One fragment (a list of frame indices) per frame, in order: PyTorch's
    // symbolize() indexes fragments by the frames' positions.
    for (const PyFrame& frame : to_symbolize) {
      auto* code = static_cast<PyCodeObject*>(frame.code);
      torch::unwind::Frame symbolized;
      if (code != nullptr) {
        symbolized.filename = Utf8(code->co_filename);
        symbolized.funcname = Utf8(code->co_name);
        symbolized.lineno = static_cast<uint64_t>(PyCode_Addr2Line(code, frame.lasti));
      } else {
        symbolized = torch::unwind::Frame{"?", "?", 0};
      }
      st.tracebacks.push_back({st.all_frames.size()});
      st.all_frames.push_back(std::move(symbolized));
    }
    PyGILState_Release(gil);
  }

  int traverse(std::vector<PyFrame>& frames, torch::CapturedTraceback::visitproc visit,
               void* arg) override {
    for (PyFrame& frame : frames) {
      if (frame.code == nullptr) continue;
      if (const int result = visit(frame.code, arg); result != 0) return result;
    }
    return 0;
  }

  int clear(std::vector<PyFrame>& frames) override {
    for (PyFrame& frame : frames) {
      PyObject* code = static_cast<PyObject*>(frame.code);
      frame.code = nullptr;
      Py_XDECREF(code);
    }
    return 0;
  }
};

// PyTorch's gather(python, script, cpp) with `captured` as its Python frames
// (their references move to the context). Requires the GIL.
std::shared_ptr<c10::GatheredContext> GatherHandingOver(const std::vector<ContextFrame>& captured,
                                                        bool script, bool cpp) {
  std::vector<PyFrame> frames;
  frames.reserve(captured.size());
  for (const ContextFrame& frame : captured) frames.push_back(PyFrame{frame.code, frame.offset});
  t_handover = &frames;
  std::shared_ptr<c10::GatheredContext> context =
      torch::CapturedTraceback::gather(/*python=*/true, script, cpp);
  t_handover = nullptr;
  // Not handed over (another unwinder answered first): drop our references.
  for (PyFrame& frame : frames) Py_XDECREF(static_cast<PyObject*>(frame.code));
  return context;
}

}  // namespace

void RegisterTracebackUnwinder() {
  static std::once_flag once;
  // Never deleted: PyTorch keeps the pointer for the life of the process.
  std::call_once(once, [] { torch::CapturedTraceback::addPythonUnwinder(new TorchmemUnwinder); });
}

std::shared_ptr<c10::GatheredContext> ContextFor(ContextId id) {
  if ((id & kDerivedContextBit) != 0) return DerivedContext(id);
  if (id == kNoContext || !InterpreterAlive()) return nullptr;
  const PyGILState_STATE gil = PyGILState_Ensure();
  std::vector<ContextFrame> captured;
  std::shared_ptr<c10::GatheredContext> context;
  if (ResolveContextFrames(id, &captured) && !captured.empty()) {
    context = GatherHandingOver(captured, /*script=*/false, /*cpp=*/false);
  }
  PyGILState_Release(gil);
  return context;
}

std::shared_ptr<c10::GatheredContext> GatherWithPythonStack(ContextId python_stack, bool cpp) {
  if (!InterpreterAlive()) {
    return torch::CapturedTraceback::gather(/*python=*/false, /*script=*/true, cpp);
  }
  const PyGILState_STATE gil = PyGILState_Ensure();
  std::vector<ContextFrame> captured;
  // An empty handover when there is no Python stack (a thread Python never
  // ran on): the context then has C++ and TorchScript frames only.
  if (!ResolveContextFrames(python_stack, &captured)) captured.clear();
  std::shared_ptr<c10::GatheredContext> context = GatherHandingOver(captured, /*script=*/true, cpp);
  PyGILState_Release(gil);
  return context;
}

std::shared_ptr<c10::GatheredContext> ContextCache::Get(ContextId id) {
  if (id == kNoContext) return nullptr;
  auto [it, inserted] = contexts_.try_emplace(id, nullptr);
  if (inserted) it->second = ContextFor(id);
  return it->second;
}

}  // namespace torchmem::torch_glue
