#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace rl::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

template <typename T>
struct SplitArgs {
  const float* q;
  const T* k_cache;
  const T* v_cache;
  const int32_t* context_len;
  const int32_t* slot_begin;
  const int32_t* slots;
  float* part_out;  // [tokens, heads, max_splits, head_dim]
  float* part_ml;   // [tokens, heads, max_splits, 2] (max, exp-sum)
  int64_t token_begin;
  int64_t q_stride;
  int num_heads;
  int group;  // num_heads / num_kv_heads
  int kv_dim;
  int head_dim;
  int max_splits;
  float scale;
};

// Block (token, KV head, split) for all `group` query heads that share the KV head, so each K
// and V row of the split is read once: scores of the split's positions (one warp per position,
// lanes over head_dim, fixed butterfly, one sum per query head), each head's max and exp-sum
// (fixed block reductions), then the unnormalised weighted V sums (thread per (head, dimension),
// positions in order). Per (token, head) the arithmetic order is the same whatever the batch.
// Shared memory: q [group, head_dim], scores [group, kAttentionSplit], slot ids
// [kAttentionSplit], scratch [33].
template <typename T>
__global__ void AttentionSplitKernel(SplitArgs<T> a) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* scores = qs + a.group * a.head_dim;
  int32_t* sl = reinterpret_cast<int32_t*>(scores + a.group * kAttentionSplit);
  float* scratch = reinterpret_cast<float*>(sl + kAttentionSplit);

  const int64_t local_t = blockIdx.x;
  const int64_t t = a.token_begin + local_t;
  const int kvh = blockIdx.y;
  const int split = blockIdx.z;
  const int len = a.context_len[t];
  const int start = split * kAttentionSplit;
  if (start >= len) return;  // whole block exits together: no barrier is skipped
  const int n = min(len - start, kAttentionSplit);
  const int h0 = kvh * a.group;  // first query head of the group

  const float* q = a.q + t * a.q_stride + static_cast<int64_t>(h0) * a.head_dim;
  for (int i = threadIdx.x; i < a.group * a.head_dim; i += blockDim.x) qs[i] = q[i];
  const int32_t* seq_slots = a.slots + a.slot_begin[t] + start;
  for (int j = threadIdx.x; j < n; j += blockDim.x) sl[j] = seq_slots[j];
  __syncthreads();

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t head_off = static_cast<int64_t>(kvh) * a.head_dim;
  for (int j = warp; j < n; j += kWarps) {
    const T* kr = a.k_cache + static_cast<int64_t>(sl[j]) * a.kv_dim + head_off;
    for (int g = 0; g < a.group; ++g) {
      const float* qg = qs + g * a.head_dim;
      float dot = 0.0f;
      for (int d = lane; d < a.head_dim; d += 32) dot += qg[d] * ToF32(kr[d]);
      dot = WarpSum(dot);
      if (lane == 0) scores[g * kAttentionSplit + j] = dot * a.scale;
    }
  }
  __syncthreads();

  for (int g = 0; g < a.group; ++g) {
    float* sg = scores + g * kAttentionSplit;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, sg[j]);
    m = BlockMax(m, scratch);
    float l = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const float p = expf(sg[j] - m);
      sg[j] = p;
      l += p;
    }
    l = BlockSum(l, scratch);  // its barriers also publish the probabilities
    if (threadIdx.x == 0) {
      const int64_t part = (local_t * a.num_heads + h0 + g) * a.max_splits + split;
      a.part_ml[part * 2] = m;
      a.part_ml[part * 2 + 1] = l;
    }
  }

  for (int i = threadIdx.x; i < a.group * a.head_dim; i += blockDim.x) {
    const int g = i / a.head_dim;
    const int d = i - g * a.head_dim;
    const float* sg = scores + g * kAttentionSplit;
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) {
      acc += sg[j] * ToF32(a.v_cache[static_cast<int64_t>(sl[j]) * a.kv_dim + head_off + d]);
    }
    const int64_t part = (local_t * a.num_heads + h0 + g) * a.max_splits + split;
    a.part_out[part * a.head_dim + d] = acc;
  }
}

// Block (token, head): merges the token's splits in split order.
__global__ void AttentionCombineKernel(const float* __restrict__ part_out,
                                       const float* __restrict__ part_ml,
                                       const int32_t* __restrict__ context_len, float* out,
                                       int64_t token_begin, int num_heads, int head_dim,
                                       int max_splits) {
  const int64_t local_t = blockIdx.x;
  const int64_t t = token_begin + local_t;
  const int h = blockIdx.y;
  const int num_splits = (context_len[t] + kAttentionSplit - 1) / kAttentionSplit;
  const int64_t base = (local_t * num_heads + h) * max_splits;
  float m = -INFINITY;
  for (int s = 0; s < num_splits; ++s) m = fmaxf(m, part_ml[(base + s) * 2]);
  float l = 0.0f;
  for (int s = 0; s < num_splits; ++s) {
    l += part_ml[(base + s) * 2 + 1] * expf(part_ml[(base + s) * 2] - m);
  }
  const float inv = 1.0f / l;
  float* o = out + (t * num_heads + h) * static_cast<int64_t>(head_dim);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < num_splits; ++s) {
      acc += part_out[(base + s) * head_dim + d] * expf(part_ml[(base + s) * 2] - m);
    }
    o[d] = acc * inv;
  }
}

int64_t MaxSplits(int64_t batch_max_context) {
  return std::max<int64_t>(1, (batch_max_context + kAttentionSplit - 1) / kAttentionSplit);
}

}  // namespace

int64_t AttentionWorkspaceFloats(int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                                 int64_t batch_max_context) {
  return num_tokens * num_heads * MaxSplits(batch_max_context) * (head_dim + 2);
}

namespace {

template <typename T>
cudaError_t LaunchAttentionTyped(const AttentionParams& p, int64_t token_begin, int64_t num_tokens,
                                 int64_t max_splits, float* workspace, cudaStream_t stream) {
  SplitArgs<T> a;
  a.q = p.q;
  a.k_cache = static_cast<const T*>(p.k_cache);
  a.v_cache = static_cast<const T*>(p.v_cache);
  a.context_len = p.context_len;
  a.slot_begin = p.slot_begin;
  a.slots = p.slots;
  a.part_out = workspace;
  a.part_ml = workspace + num_tokens * p.num_heads * max_splits * p.head_dim;
  a.token_begin = token_begin;
  a.q_stride = p.q_stride;
  a.num_heads = static_cast<int>(p.num_heads);
  a.group = static_cast<int>(p.num_heads / p.num_kv_heads);
  a.kv_dim = static_cast<int>(p.num_kv_heads * p.head_dim);
  a.head_dim = static_cast<int>(p.head_dim);
  a.max_splits = static_cast<int>(max_splits);
  a.scale = p.scale;
  const size_t group = static_cast<size_t>(a.group);
  const size_t smem =
      (group * static_cast<size_t>(p.head_dim) + group * kAttentionSplit + kAttentionSplit + 33) *
      sizeof(float);
  if (smem > 48 * 1024) return cudaErrorInvalidValue;  // group x head_dim beyond one block
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(max_splits));
  AttentionSplitKernel<T><<<grid, kThreads, smem, stream>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const dim3 grid2(static_cast<unsigned>(num_tokens), static_cast<unsigned>(p.num_heads));
  AttentionCombineKernel<<<grid2, kThreads, 0, stream>>>(a.part_out, a.part_ml, p.context_len,
                                                         p.out, token_begin, a.num_heads,
                                                         a.head_dim, a.max_splits);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAttention(const AttentionParams& p, int64_t token_begin, int64_t token_end,
                            int64_t batch_max_context, float* workspace, cudaStream_t stream) {
  const int64_t num_tokens = token_end - token_begin;
  if (num_tokens <= 0) return cudaSuccess;
  if (p.num_kv_heads > 65535) return cudaErrorInvalidValue;
  const int64_t max_splits = MaxSplits(batch_max_context);
  if (max_splits > 65535) return cudaErrorInvalidValue;
  RL_DISPATCH_FLOAT_DTYPE(
      p.kv_dtype, T,
      return LaunchAttentionTyped<T>(p, token_begin, num_tokens, max_splits, workspace, stream));
  return cudaSuccess;
}

}  // namespace rl::kernels::cuda
