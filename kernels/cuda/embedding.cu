#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace rl::kernels::cuda {
namespace {

// One block per token: widen its table row to float32.
template <typename T>
__global__ void EmbeddingKernel(const T* __restrict__ table, const int32_t* __restrict__ ids,
                                float* __restrict__ out, int64_t dim) {
  const int64_t t = blockIdx.x;
  const T* row = table + static_cast<int64_t>(ids[t]) * dim;
  float* o = out + t * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = ToF32(row[i]);
}

}  // namespace

cudaError_t LaunchEmbedding(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  RL_DISPATCH_FLOAT_DTYPE(p.table_dtype, T,
                          EmbeddingKernel<T>
                          <<<static_cast<unsigned>(p.num_tokens), 256, 0, stream>>>(
                              static_cast<const T*>(p.table), p.ids, p.out, p.dim));
  return cudaGetLastError();
}

}  // namespace rl::kernels::cuda
