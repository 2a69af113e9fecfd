// Small SIMD vector primitives shared by the CPU kernels (Highway, dynamic dispatch to the best
// target the CPU supports). Each has a fixed reduction order that depends only on `n` (vector
// lanes accumulate in index order, then one fixed horizontal sum, then the scalar tail in
// order), so equal inputs give bit-identical results wherever they sit in a batch.
#pragma once

#include <cstdint>

namespace rl::kernels::cpu {

// sum_i a[i] * b[i]
float Dot(const float* a, const float* b, int64_t n);
// sum_i a[i]^2
float SumSquares(const float* a, int64_t n);
// y[i] += alpha * x[i]
void Axpy(float alpha, const float* x, float* y, int64_t n);
// y[i] *= alpha
void Scale(float alpha, float* y, int64_t n);
// out[i] = silu(gate[i]) · up[i] = gate[i] / (1 + e^-gate[i]) · up[i], elementwise with
// Highway's vectorized Exp (1 ULP); the same operations for every element wherever it sits.
void SiluMulRange(const float* gate, const float* up, float* out, int64_t n);
// RoPE's rotate-half on one head of 2·half floats: x[i], x[i + half] become
// x[i]·cos[i] − x[i + half]·sin[i] and x[i + half]·cos[i] + x[i]·sin[i] (two products, then the
// difference or sum, each rounded: the scalar code's operations, vectorized).
void RotateHalves(float* x, const float* cos, const float* sin, int64_t half);
// out[i] = x[i] == -inf ? 0 : e^((x[i] − shift) · scale) in double (the difference, then the
// product, each rounded; then Highway's vectorized Exp, within 1 ULP of std::exp, 0 below
// e^-1000 and for a NaN argument, where std::exp gives NaN): the sampler's unnormalized
// probabilities, a vector of lanes per step instead of a call per element. `out` may be `x`.
void ExpShiftScale(const double* x, double* out, int64_t n, double shift, double scale);
// Σ_i e^(x[i] · scale − shift) in double over float x (x[i] widened, the product, then the
// difference, each rounded; Exp as above), summed in per-lane partial sums in index order, then
// the lanes' sum: the log-softmax's normalizer.
double SumExpScaled(const float* x, int64_t n, double scale, double shift);
// XOR of every 8-byte word of `data` (a trailing partial word is ignored): a read-only stream
// with four independent SIMD accumulators, for measuring the read bandwidth (runner_bench).
uint64_t XorWords(const void* data, int64_t bytes);

}  // namespace rl::kernels::cpu
