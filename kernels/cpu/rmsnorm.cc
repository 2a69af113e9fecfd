#include "kernels/cpu/rmsnorm.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/vec_ops.h"

namespace rl::kernels::cpu {

absl::Status RmsNormParams::Validate() const {
  if (x == nullptr || w == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("rmsnorm: null x, w or y");
  }
  if (rows < 0 || dim <= 0 || !(eps >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("rmsnorm: bad rows=", rows, " dim=", dim));
  }
  if (!model_io::IsFloatWeightDType(w_dtype)) {
    return absl::InvalidArgumentError("rmsnorm: weight must be F32, BF16 or F16");
  }
  return absl::OkStatus();
}

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
