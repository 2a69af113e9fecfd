#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace rl::kernels::cuda {
namespace {

__global__ void SiluMulKernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

}  // namespace

cudaError_t LaunchSiluMul(const SiluMulParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const unsigned blocks = CeilDiv(p.n, 256) < 65535u ? CeilDiv(p.n, 256) : 65535u;
  SiluMulKernel<<<blocks, 256, 0, stream>>>(p.gate, p.up, p.out, p.n);
  return cudaGetLastError();
}

}  // namespace rl::kernels::cuda
