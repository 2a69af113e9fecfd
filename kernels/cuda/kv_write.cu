#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace rl::kernels::cuda {
namespace {

// One block per token: copy its K and V rows into their cache slot.
__global__ void WriteKvKernel(const float* __restrict__ k, const float* __restrict__ v,
                              const int32_t* __restrict__ slots, float* k_cache, float* v_cache,
                              int64_t kv_dim, int64_t k_stride, int64_t v_stride) {
  const int64_t t = blockIdx.x;
  const int64_t s = slots[t];
  for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x) {
    k_cache[s * kv_dim + i] = k[t * k_stride + i];
    v_cache[s * kv_dim + i] = v[t * v_stride + i];
  }
}

}  // namespace

cudaError_t LaunchWriteKv(const cpu::WriteKvParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  WriteKvKernel<<<static_cast<unsigned>(p.num_tokens), 128, 0, stream>>>(
      p.k, p.v, p.slots, p.k_cache, p.v_cache, p.kv_dim, p.k_stride, p.v_stride);
  return cudaGetLastError();
}

}  // namespace rl::kernels::cuda
