// An nvcc-built program (-cudart shared) with a <<<...>>> launch: exercises
// the CUDA 13 registration and launch entry points (__cudaRegisterFatBinary,
// __cudaPushCallConfiguration, __cudaGetKernel, __cudaLaunchKernel) against
// the simulated device. The kernel does not run there; only the calls are
// checked.
#include <cstdio>

__global__ void Fill(int* out, int value) { out[threadIdx.x] = value; }

int main() {
  int* p = nullptr;
  if (cudaMalloc(&p, 32 * sizeof(int)) != cudaSuccess) return 1;
  Fill<<<1, 32>>>(p, 7);
  const cudaError_t launch = cudaGetLastError();
  const cudaError_t sync = cudaDeviceSynchronize();
  int host[32];
  const cudaError_t copy = cudaMemcpy(host, p, sizeof(host), cudaMemcpyDeviceToHost);
  std::printf("launch=%d sync=%d copy=%d\n", launch, sync, copy);
  cudaFree(p);
  return launch == cudaSuccess && sync == cudaSuccess && copy == cudaSuccess ? 0 : 2;
}
