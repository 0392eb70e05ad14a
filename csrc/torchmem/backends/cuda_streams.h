// Streams of another device than a block's, as the engine's StreamId.
//
// The engine of a device identifies streams by their cudaStream_t. That is
// not enough for a block used by a stream of another device
// (Tensor.record_stream with a peer's stream): every device's default stream
// is the same handle (nullptr), and the event that waits for such a stream
// must be created and recorded on that stream's device. So the glue hands
// the engine a stream of another device as a token from here, which the
// CudaBackend resolves back to (device, stream) when it records the event.
// Tokens are interned and never freed (one per (device, stream) pair used).
#ifndef TORCHMEM_BACKENDS_CUDA_STREAMS_H_
#define TORCHMEM_BACKENDS_CUDA_STREAMS_H_

#include <cuda_runtime_api.h>

#include "torchmem/core/types.h"

namespace torchmem {

struct ForeignStream {
  int device;
  cudaStream_t stream;
};

// The StreamId standing for `stream` of `device` in another device's engine.
StreamId ForeignStreamId(int device, cudaStream_t stream);
// The (device, stream) of a token from ForeignStreamId, or nullptr if
// `stream` is a plain cudaStream_t.
const ForeignStream* AsForeignStream(StreamId stream);

}  // namespace torchmem

#endif  // TORCHMEM_BACKENDS_CUDA_STREAMS_H_
