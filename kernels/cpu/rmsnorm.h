// CPU RMSNorm over the params of kernels/rmsnorm.h. Batch invariance: each row's sum of squares
// has a fixed order (see vec_ops.h). Cost: 2·rows·dim flops, parallel over rows.
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/rmsnorm.h"

namespace rl::kernels::cpu {

// Run after p.Validate().
void RmsNorm(const RmsNormParams& p, ThreadPool* pool);

}  // namespace rl::kernels::cpu
