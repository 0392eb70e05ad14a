// A host program linked against NVIDIA's real shared CUDA runtime
// (CUDA::cudart). preload_test runs it with and without the simulated
// device preloaded; it prints key=value lines and exits 0 if all went well.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  std::printf("device_count_status=%d\n", err);
  if (err != cudaSuccess) return 1;
  std::printf("device_count=%d\n", count);
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return 2;
  std::printf("name=%s\n", prop.name);
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 3;
  std::printf("total=%zu\n", total);
  void* p = nullptr;
  err = cudaMalloc(&p, 1 << 20);
  std::printf("malloc=%d\n", err);
  if (err != cudaSuccess) return 4;
  std::vector<char> in(1 << 20), out(1 << 20);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<char>(i * 31);
  if (cudaMemcpy(p, in.data(), in.size(), cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemcpy(out.data(), p, out.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
    return 5;
  }
  std::printf("roundtrip=%s\n", std::memcmp(in.data(), out.data(), in.size()) == 0 ? "ok" : "bad");
  return cudaFree(p) == cudaSuccess ? 0 : 6;
}
