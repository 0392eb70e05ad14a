// Carries torchmem's tag and scope into the threads PyTorch runs work on.
//
// PyTorch propagates c10::ThreadLocalDebugInfo from the thread that starts
// work to the threads that do it (autograd's backward workers, at::launch
// tasks). Each thread that opens a tag or scope gets one debug-info entry of
// torchmem's kind in its chain, holding that thread's current innermost tag
// and scope; a worker whose own stacks are empty reads the entry it inherited
// (through the core's AttributionProvider), so memory allocated by
// loss.backward() inside torchmem.tag("train") is charged to "train".
#ifndef TORCHMEM_TORCH_ATTRIBUTION_PROPAGATION_H_
#define TORCHMEM_TORCH_ATTRIBUTION_PROPAGATION_H_

namespace torchmem::torch_glue {

// Installs the provider. Idempotent.
void InstallAttributionPropagation();

// Publishes the calling thread's current tag and scope to the threads that
// inherit its debug info. Call after every tag/scope push and pop.
void PublishThreadAttribution();

}  // namespace torchmem::torch_glue

#endif  // TORCHMEM_TORCH_ATTRIBUTION_PROPAGATION_H_
