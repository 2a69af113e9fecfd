#include "kernels/cpu/rmsnorm.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/vec_ops.h"

namespace rl::kernels::cpu {

namespace {

// Rows [begin, end) of the norm, each first adding its row of `delta` into x when given.
void NormRows(const float* delta, const RmsNormParams& p, const std::vector<float>& w,
              int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    if (delta != nullptr) {
      float* xr = const_cast<float*>(p.x) + r * p.dim;
      const float* dr = delta + r * p.dim;
      for (int64_t i = 0; i < p.dim; ++i) xr[i] += dr[i];
    }
    const float* x = p.x + r * p.dim;
    float* y = p.y + r * p.dim;
    const float mean = SumSquares(x, p.dim) / static_cast<float>(p.dim);
    const float inv = 1.0f / std::sqrt(mean + p.eps);
    for (int64_t i = 0; i < p.dim; ++i) y[i] = w[i] * (x[i] * inv);
  }
}

void Run(const float* delta, const RmsNormParams& p, ThreadPool* pool) {
  std::vector<float> w(static_cast<size_t>(p.dim));
  model_io::ConvertToF32(p.w_dtype, p.w, p.dim, w.data());
  auto run = [&](int64_t begin, int64_t end, int) { NormRows(delta, p, w, begin, end); };
  if (pool == nullptr || p.rows * p.dim < 16384) {
    run(0, p.rows, 0);
  } else {
    pool->ParallelFor(p.rows, run);
  }
}

}  // namespace

void RmsNorm(const RmsNormParams& p, ThreadPool* pool) { Run(nullptr, p, pool); }

void AddRmsNorm(const float* delta, const RmsNormParams& p, ThreadPool* pool) {
  Run(delta, p, pool);
}

}  // namespace rl::kernels::cpu
