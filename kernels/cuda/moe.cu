#include <cmath>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace rl::kernels::cuda {
namespace {

constexpr int kThreads = 128;

// One thread per token: softmax in float32 (max, exp, sum in index order, times 1 / sum), then
// k passes of "largest remaining weight, lowest index on equal weights".
__global__ void MoeRouteKernel(const float* __restrict__ logits, int32_t* __restrict__ ids,
                               float* __restrict__ weights, int64_t num_tokens, int64_t num_experts,
                               int64_t top_k, bool norm) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= num_tokens) return;
  const float* row = logits + t * num_experts;
  float max = -INFINITY;
  for (int64_t i = 0; i < num_experts; ++i) max = fmaxf(max, row[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < num_experts; ++i) sum += expf(row[i] - max);
  const float inv = 1.0f / sum;
  int32_t* out_ids = ids + t * top_k;
  float* out_w = weights + t * top_k;
  float top_sum = 0.0f;
  for (int64_t j = 0; j < top_k; ++j) {
    int32_t best = -1;
    float best_w = 0.0f;
    for (int64_t i = 0; i < num_experts; ++i) {
      bool taken = false;
      for (int64_t q = 0; q < j; ++q) taken = taken || out_ids[q] == i;
      if (taken) continue;
      const float w = expf(row[i] - max) * inv;
      if (best < 0 || w > best_w) {
        best = static_cast<int32_t>(i);
        best_w = w;
      }
    }
    out_ids[j] = best;
    out_w[j] = best_w;
    top_sum += best_w;
  }
  if (norm) {
    for (int64_t j = 0; j < top_k; ++j) out_w[j] /= top_sum;
  }
}

// One block per routed row: y[rows[r]] += w[r] · out[r]. A token appears at most once per
// expert, so the rows of one launch are distinct.
__global__ void MoeCombineKernel(const float* __restrict__ out, const int32_t* __restrict__ rows,
                                 const float* __restrict__ w, int64_t dim, float* __restrict__ y) {
  const int64_t r = blockIdx.x;
  float* dst = y + static_cast<int64_t>(rows[r]) * dim;
  const float scale = w[r];
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] += out[r * dim + i] * scale;
}

}  // namespace

cudaError_t LaunchMoeRoute(const MoeRouteParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((p.num_tokens + kThreads - 1) / kThreads);
  MoeRouteKernel<<<blocks, kThreads, 0, stream>>>(p.logits, p.ids, p.weights, p.num_tokens,
                                                  p.num_experts, p.top_k, p.norm_topk_prob);
  return cudaGetLastError();
}

cudaError_t LaunchMoeCombine(const float* out, const int32_t* rows, const float* weights,
                             int64_t num_rows, int64_t dim, float* y, cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  MoeCombineKernel<<<static_cast<unsigned>(num_rows), kThreads, 0, stream>>>(out, rows, weights,
                                                                             dim, y);
  return cudaGetLastError();
}

}  // namespace rl::kernels::cuda
