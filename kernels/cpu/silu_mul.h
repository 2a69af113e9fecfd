// CPU SiluMul over the params of kernels/silu_mul.h. Cost: O(n), parallel over contiguous
// ranges (elementwise, so trivially invariant).
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/silu_mul.h"

namespace rl::kernels::cpu {

// Run after p.Validate().
void SiluMul(const SiluMulParams& p, ThreadPool* pool);

}  // namespace rl::kernels::cpu
