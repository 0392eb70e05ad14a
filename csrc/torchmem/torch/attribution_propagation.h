// Carries torchmem's tag and scope into the threads PyTorch runs work on.
//
// PyTorch propagates c10::ThreadLocalDebugInfo from the thread that starts
// work to the threads that do it (autograd's backward workers, at::launch
// tasks, torch.distributed's Gloo workers). A thread that opens a tag or a
// scope keeps one debug-info entry of torchmem's kind at the head of its
// chain; a worker whose own stacks are empty reads the entry it inherited
// (through the core's AttributionProvider), so memory allocated by
// loss.backward() inside torchmem.tag("train") is charged to "train".
//
// Invariants:
//   - The tag is a snapshot: the entry a worker inherited names the tag that
//     was open when PyTorch captured the chain (when the work was issued).
//     An asynchronous collective issued inside tag("comm") and run by a Gloo
//     worker after the issuing thread moved on to tag("other") is charged to
//     "comm". Each tag change therefore replaces the thread's entry.
//   - The scope is live: the entry reads the issuing thread's innermost open
//     scope at allocation time (scopes close, and a closed scope must never
//     be stamped on a block; leak checks own what is allocated while they
//     are open).
//   - A thread whose own stacks are empty pushes nothing: whatever it
//     inherited stays in force for the work it starts.
//   - If code other than torchmem replaced the thread's chain after the
//     last update (a DebugInfoGuard, a ThreadLocalStateGuard), the next
//     update builds on that chain instead of unwinding it.
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
