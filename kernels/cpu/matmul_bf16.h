// Matmul with bf16 products, an opt-in mode that is NOT exact: x is rounded to bfloat16
// (nearest even) and AVX512-BF16's vdpbf16ps adds pairs of bf16 × bf16 products into float32
// accumulators, as a bf16 trainer's matmul does: twice the products per instruction of the
// float32 path and no widening of the weights. Results differ from the default Matmul (float32
// activations) by the rounding of x; the worker's --cpu-bf16-products documents the measured
// logprob difference. Still batch-invariant: every y[i][j] is computed in one fixed order
// (vector blocks of 32 elements in index order, pairs within a lane, one horizontal sum by
// _mm512_reduce_add_ps's tree, the scalar tail, then + bias) whatever m, the tiling, the kernel
// plan or the thread count. BF16 weights only.
// Tiles: 8 x 3 (24 accumulators; the k loop in inline asm, 98% of vdpbf16ps' peak alone on
// Zen 5), then 4 x 3, 2 x 8 and 1 x 8; the horizontal sums 16 at a time (reduce_avx512.h);
// weight slabs and k chunks sized from the CPU's caches (the KernelPlan); the next tile's
// weights prefetched in address order. Where vdpbf16ps issues at the float32 FMA's rate (AMD Zen
// 4 / 5) this mode has twice the exact path's peak; on Sapphire Rapids (half rate) it has none.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace rl::kernels::cpu {

// Whether this CPU runs the bf16-products kernels (x86-64 with AVX512-BF16).
bool Bf16ProductsSupported();

// MatmulGroup in bf16-products mode: ValidateMatmulGroup, every weight BF16, and a supporting
// CPU, else an error naming the problem.
absl::Status ValidateMatmulGroupBf16Products(absl::Span<const MatmulParams> group);
void MatmulGroupBf16Products(absl::Span<const MatmulParams> group, ThreadPool* pool,
                             const KernelPlan& plan = GetKernelPlan());

// The kernels behind it (matmul_bf16.cc); call only when Bf16ProductsSupported().
// Rows [r0, r1) of x [.., k] rounded to bf16 into out (same layout).
void PackRowsBf16(const float* x, int64_t k, int64_t r0, int64_t r1, uint16_t* out);
// Columns [c_begin, c_end) of y = xb · wᵀ for all m rows (no bias).
void MatmulColumnsBf16(const uint16_t* xb, const uint16_t* w, float* y, int64_t m, int64_t n,
                       int64_t k, int64_t c_begin, int64_t c_end, const KernelPlan& plan);

}  // namespace rl::kernels::cpu
