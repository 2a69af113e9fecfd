#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace rl::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row. Each thread owns the same elements in both passes (i ≡ tid mod blockDim),
// so y may alias x or delta without a race. The sum of squares has a fixed order per row.
template <typename T>
__global__ void RmsNormKernel(float* x, const float* delta, const T* __restrict__ w, float* y,
                              int64_t dim, float eps) {
  __shared__ float scratch[33];
  const int64_t row = blockIdx.x;
  float* xr = x + row * dim;
  float ss = 0.0f;
  if (delta != nullptr) {
    const float* dr = delta + row * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const float v = xr[i] + dr[i];
      xr[i] = v;
      ss += v * v;
    }
  } else {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const float v = xr[i];
      ss += v * v;
    }
  }
  ss = BlockSum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  float* yr = y + row * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = ToF32(w[i]) * (xr[i] * inv);
}

}  // namespace

cudaError_t LaunchRmsNorm(const RmsNormParams& p, const float* delta, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  // x is written only when delta is given; the kernel takes it non-const for that case.
  float* x = const_cast<float*>(p.x);
  RL_DISPATCH_FLOAT_DTYPE(p.w_dtype, T,
                          RmsNormKernel<T><<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(
                              x, delta, static_cast<const T*>(p.w), p.y, p.dim, p.eps));
  return cudaGetLastError();
}

}  // namespace rl::kernels::cuda
