#include "kernels/cpu/rmsnorm.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/vec_ops.h"

namespace rl::kernels::cpu {

void RmsNorm(const RmsNormParams& p, ThreadPool* pool) {
  std::vector<float> w(static_cast<size_t>(p.dim));
  model_io::ConvertToF32(p.w_dtype, p.w, p.dim, w.data());
  auto run = [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const float* x = p.x + r * p.dim;
      float* y = p.y + r * p.dim;
      const float mean = SumSquares(x, p.dim) / static_cast<float>(p.dim);
      const float inv = 1.0f / std::sqrt(mean + p.eps);
      for (int64_t i = 0; i < p.dim; ++i) y[i] = w[i] * (x[i] * inv);
    }
  };
  if (pool == nullptr || p.rows * p.dim < 16384) {
    run(0, p.rows, 0);
  } else {
    pool->ParallelFor(p.rows, run);
  }
}

}  // namespace rl::kernels::cpu
