// Labels carried by trace entries, as PyTorch's memory history records them:
// the user metadata set process-wide (torch.cuda.memory._set_memory_metadata,
// stamped on every entry while set), the compile context of the calling
// thread (the innermost torch.compile region PyTorch pushed), and the text of
// annotations (torch.cuda.memory._annotate_tensor).
//
// Texts are interned as small ids, so a trace entry stays a few words and
// recording one costs two loads; ids are resolved to text only when a
// snapshot is built. Interned texts live for the process (like tag names):
// labels are a few distinct strings, not one per step. Id 0 is "no label".
// Thread-safe. Lives in libtorchmem.so, so both extension modules share it.
#ifndef TORCHMEM_CORE_TRACE_LABELS_H_
#define TORCHMEM_CORE_TRACE_LABELS_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace torchmem {

using TraceLabel = std::uint32_t;
inline constexpr TraceLabel kNoTraceLabel = 0;

// The id of `text` ("" is kNoTraceLabel).
TraceLabel InternTraceLabel(std::string_view text);
// The text of `label` ("" for kNoTraceLabel or an unknown id).
std::string TraceLabelText(TraceLabel label);

// Process-wide user metadata stamped on new trace entries.
void SetTraceUserMetadata(TraceLabel label);
TraceLabel TraceUserMetadata();

// The calling thread's stack of compile contexts; the top is stamped on the
// trace entries this thread causes. Popping an empty stack does nothing.
void PushTraceCompileContext(TraceLabel label);
void PopTraceCompileContext();
TraceLabel TraceCompileContext();

}  // namespace torchmem

#endif  // TORCHMEM_CORE_TRACE_LABELS_H_
