#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace rl::kernels::cuda {
namespace {

constexpr int kBm = 64;        // rows of x per block
constexpr int kBn = 64;        // rows of W (output columns) per block
constexpr int kBk = 16;        // k per shared-memory tile
constexpr int kThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each

// y[i][j] = fma chain over k = 0..K-1 in order (zero-padded tail adds exact zeros), + bias.
// The order depends on nothing but k, so the result is the same for any m and any tile.
template <typename T, typename B>
__global__ void InvariantGemmKernel(const float* __restrict__ x, const T* __restrict__ w,
                                    const B* __restrict__ bias, float* __restrict__ y, int64_t m,
                                    int64_t n, int64_t k) {
  __shared__ float xs[kBk][kBm + 1];
  __shared__ float ws[kBk][kBn + 1];
  const int tx = threadIdx.x % 16;
  const int ty = threadIdx.x / 16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kBm;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBn;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < k; k0 += kBk) {
    for (int i = threadIdx.x; i < kBm * kBk; i += kThreads) {
      const int r = i / kBk;
      const int c = i % kBk;
      const int64_t gr = row0 + r;
      const int64_t gc = k0 + c;
      xs[c][r] = (gr < m && gc < k) ? x[gr * k + gc] : 0.0f;
    }
    for (int i = threadIdx.x; i < kBn * kBk; i += kThreads) {
      const int r = i / kBk;
      const int c = i % kBk;
      const int64_t gr = col0 + r;
      const int64_t gc = k0 + c;
      ws[c][r] = (gr < n && gc < k) ? ToF32(w[gr * k + gc]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBk; ++kk) {
      float a[4];
      float b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = row0 + ty * 4 + i;
    if (r >= m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = col0 + tx * 4 + j;
      if (c >= n) continue;
      y[r * n + c] = bias != nullptr ? acc[i][j] + ToF32(bias[c]) : acc[i][j];
    }
  }
}

template <typename T>
cudaError_t LaunchWithWeight(const MatmulParams& p, cudaStream_t stream) {
  const dim3 grid(CeilDiv(p.n, kBn), CeilDiv(p.m, kBm));
  if (grid.y > 65535u) return cudaErrorInvalidValue;
  const T* w = static_cast<const T*>(p.w);
  if (p.bias == nullptr) {
    InvariantGemmKernel<T, float>
        <<<grid, kThreads, 0, stream>>>(p.x, w, nullptr, p.y, p.m, p.n, p.k);
    return cudaGetLastError();
  }
  RL_DISPATCH_FLOAT_DTYPE(p.bias_dtype, B,
                          InvariantGemmKernel<T, B><<<grid, kThreads, 0, stream>>>(
                              p.x, w, static_cast<const B*>(p.bias), p.y, p.m, p.n, p.k));
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchInvariantMatmul(const MatmulParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  RL_DISPATCH_FLOAT_DTYPE(p.w_dtype, T, return LaunchWithWeight<T>(p, stream));
  return cudaSuccess;
}

}  // namespace rl::kernels::cuda
