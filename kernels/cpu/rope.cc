#include "kernels/cpu/rope.h"

namespace rl::kernels::cpu {

namespace {
inline void RotateHead(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i];
    const float x2 = x[i + half];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}
}  // namespace

void Rope(const RopeParams& p, ThreadPool* pool) {
  const int64_t half = p.head_dim / 2;
  auto run = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = p.cos + t * half;
      const float* s = p.sin + t * half;
      for (int64_t h = 0; h < p.num_heads; ++h) RotateHead(p.q + t * p.q_stride + h * p.head_dim, c, s, half);
      for (int64_t h = 0; h < p.num_kv_heads; ++h) RotateHead(p.k + t * p.k_stride + h * p.head_dim, c, s, half);
    }
  };
  if (pool == nullptr || p.num_tokens < 8) {
    run(0, p.num_tokens, 0);
  } else {
    pool->ParallelFor(p.num_tokens, run);
  }
}

}  // namespace rl::kernels::cpu
