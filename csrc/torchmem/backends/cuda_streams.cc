#include "torchmem/backends/cuda_streams.h"

#include <memory>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace torchmem {
namespace {

struct Tokens {
  std::mutex mutex;
  absl::flat_hash_map<std::pair<int, cudaStream_t>, ForeignStream*> by_stream;
  absl::flat_hash_set<StreamId> ids;
};

// Never destroyed: events may be recorded during static destruction.
Tokens& GetTokens() {
  static Tokens* tokens = new Tokens;
  return *tokens;
}

}  // namespace

StreamId ForeignStreamId(int device, cudaStream_t stream) {
  Tokens& t = GetTokens();
  std::lock_guard<std::mutex> lock(t.mutex);
  ForeignStream*& token = t.by_stream[{device, stream}];
  if (token == nullptr) {
    // A live heap object: no stream handle can have its address meanwhile.
    token = new ForeignStream{device, stream};
    t.ids.insert(reinterpret_cast<StreamId>(token));
  }
  return reinterpret_cast<StreamId>(token);
}

const ForeignStream* AsForeignStream(StreamId stream) {
  Tokens& t = GetTokens();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.ids.contains(stream) ? reinterpret_cast<const ForeignStream*>(stream) : nullptr;
}

}  // namespace torchmem
