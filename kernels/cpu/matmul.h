// CPU matmul over the params of kernels/matmul.h: y = x · Wᵀ (+ bias), weights widened to
// float32 in SIMD registers.
//
// Batch invariance: every y[i][j] is one dot product over k with a fixed order (SIMD lanes in
// index order — for BF16 weights, lane l of each block of 2 · lanes takes elements 2l then
// 2l + 1 —, fixed horizontal sum, scalar tail, then + bias), whatever m, the tiling or the
// thread count. Work is split over output columns (threads take runs of columns from a shared
// counter), and for a long prefill also over groups of rows (about 512 KiB of x each); the k
// reduction is never split across threads (blocks of rows run over a long k in chunks, their
// accumulators carried in order).
// Cost: m·n·k FMAs. Register tiles of 6 × 4 (rows of x × rows of W; 4 × 3 on AVX2), then
// 4-, 2- and 1-row tiles for the rest (a 2-row tile takes 8 rows of W, 4 on AVX2; a 1-row tile 4),
// over column slabs of W kept in L2; W is widened in registers (BF16 pairs: one shift or AND per
// vector, against x packed to match once per call) and the next tile prefetched in address
// order. On AVX-512 the BF16 6 × 4 and 2 × 8 tiles run hand-scheduled asm loops
// (tiles_avx512.h: the same operations) and end with 16 horizontal sums at a time
// (reduce_avx512.h: the same additions); a scalar model of the arithmetic is tested bit for bit.
#pragma once

#include "absl/types/span.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/matmul.h"

namespace rl::kernels::cpu {

// Run after p.Validate(). `plan` picks the kernels (cpu_info.h); every plan gives the same bits.
void Matmul(const MatmulParams& p, ThreadPool* pool, const KernelPlan& plan = GetKernelPlan());

// Several matmuls with the same m run as one (fused QKV, gate/up): one parallel region splits
// all their output columns by a fixed partition, and every element is computed exactly as
// Matmul computes it (bit-identical). Run after ValidateMatmulGroup (kernels/matmul.h); the
// outputs must not overlap.
void MatmulGroup(absl::Span<const MatmulParams> group, ThreadPool* pool,
                 const KernelPlan& plan = GetKernelPlan());

}  // namespace rl::kernels::cpu
