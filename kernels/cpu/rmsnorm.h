// CPU RMSNorm over the params of kernels/rmsnorm.h. Batch invariance: each row's sum of squares
// has a fixed order (see vec_ops.h). Cost: 2·rows·dim flops, parallel over rows.
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/rmsnorm.h"

namespace rl::kernels::cpu {

// Run after p.Validate().
void RmsNorm(const RmsNormParams& p, ThreadPool* pool);

// The residual add fused with the norm after it: p.x[i] += delta[i] (rows · dim floats), then
// p.y = RmsNorm(p.x), row by row in one parallel pass; bit-identical to the add followed by
// RmsNorm. p.x is written (it is the residual stream); delta may be p.y (each row of delta is
// read before that row of y is written). Run after p.Validate(); delta non-null.
void AddRmsNorm(const float* delta, const RmsNormParams& p, ThreadPool* pool);

}  // namespace rl::kernels::cpu
