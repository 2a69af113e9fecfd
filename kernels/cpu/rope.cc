#include "kernels/cpu/rope.h"

#include "kernels/cpu/vec_ops.h"

namespace rl::kernels::cpu {

void Rope(const RopeParams& p, ThreadPool* pool) {
  const int64_t half = p.head_dim / 2;
  auto run = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = p.cos + t * half;
      const float* s = p.sin + t * half;
      for (int64_t h = 0; h < p.num_heads; ++h)
        RotateHalves(p.q + t * p.q_stride + h * p.head_dim, c, s, half);
      for (int64_t h = 0; h < p.num_kv_heads; ++h)
        RotateHalves(p.k + t * p.k_stride + h * p.head_dim, c, s, half);
    }
  };
  if (pool == nullptr || p.num_tokens < 8) {
    run(0, p.num_tokens, 0);
  } else {
    pool->ParallelFor(p.num_tokens, run);
  }
}

}  // namespace rl::kernels::cpu
