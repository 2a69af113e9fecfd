#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace rl::kernels::cuda {
namespace {

// One block per token; threads cover (head, i < head_dim / 2) pairs of q then k heads, with the
// Hugging Face rotate_half pairing (i, i + half).
__global__ void RopeKernel(float* q, float* k, const float* __restrict__ cos,
                           const float* __restrict__ sin, int num_heads, int num_kv_heads,
                           int head_dim, int64_t q_stride, int64_t k_stride) {
  const int64_t t = blockIdx.x;
  const int half = head_dim / 2;
  const int total = (num_heads + num_kv_heads) * half;
  const float* c = cos + t * half;
  const float* s = sin + t * half;
  for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int head = idx / half;
    const int i = idx - head * half;
    float* base = head < num_heads
                      ? q + t * q_stride + static_cast<int64_t>(head) * head_dim
                      : k + t * k_stride + static_cast<int64_t>(head - num_heads) * head_dim;
    const float x1 = base[i];
    const float x2 = base[i + half];
    base[i] = x1 * c[i] - x2 * s[i];
    base[i + half] = x2 * c[i] + x1 * s[i];
  }
}

}  // namespace

cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  RopeKernel<<<static_cast<unsigned>(p.num_tokens), 128, 0, stream>>>(
      p.q, p.k, p.cos, p.sin, static_cast<int>(p.num_heads), static_cast<int>(p.num_kv_heads),
      static_cast<int>(p.head_dim), p.q_stride, p.k_stride);
  return cudaGetLastError();
}

}  // namespace rl::kernels::cuda
