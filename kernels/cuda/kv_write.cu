#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace rl::kernels::cuda {
namespace {

template <typename T>
__device__ __forceinline__ T Narrow(float v);
template <>
__device__ __forceinline__ float Narrow<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 Narrow<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half Narrow<__half>(float v) {
  return __float2half_rn(v);
}

// One block per token: copy its K and V rows into their cache slot, rounded to the cache dtype.
template <typename T>
__global__ void WriteKvKernel(const float* __restrict__ k, const float* __restrict__ v,
                              const int32_t* __restrict__ slots, T* k_cache, T* v_cache,
                              int64_t kv_dim, int64_t k_stride, int64_t v_stride) {
  const int64_t t = blockIdx.x;
  const int64_t s = slots[t];
  for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x) {
    k_cache[s * kv_dim + i] = Narrow<T>(k[t * k_stride + i]);
    v_cache[s * kv_dim + i] = Narrow<T>(v[t * v_stride + i]);
  }
}

}  // namespace

cudaError_t LaunchWriteKv(const WriteKvParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  RL_DISPATCH_FLOAT_DTYPE(p.kv_dtype, T,
                          WriteKvKernel<T><<<static_cast<unsigned>(p.num_tokens), 128, 0, stream>>>(
                              p.k, p.v, p.slots, static_cast<T*>(p.k_cache),
                              static_cast<T*>(p.v_cache), p.kv_dim, p.k_stride, p.v_stride));
  return cudaGetLastError();
}

}  // namespace rl::kernels::cuda
