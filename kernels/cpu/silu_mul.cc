#include "kernels/cpu/silu_mul.h"

#include "kernels/cpu/vec_ops.h"

namespace rl::kernels::cpu {

void SiluMul(const SiluMulParams& p, ThreadPool* pool) {
  auto run = [&](int64_t begin, int64_t end, int) {
    SiluMulRange(p.gate + begin, p.up + begin, p.out + begin, end - begin);
  };
  if (pool == nullptr || p.n < 16384) {
    run(0, p.n, 0);
  } else {
    pool->ParallelFor(p.n, run);
  }
}

}  // namespace rl::kernels::cpu
