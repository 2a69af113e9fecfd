#include "kernels/cpu/vec_ops.h"

#include <cmath>

// foreach_target first, then highway.h, then the per-target headers (not sorted):
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/vec_ops.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace rl::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float DotImpl(const float* a, const float* b, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    acc = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc);
  float sum = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

float SumSquaresImpl(const float* a, int64_t n) { return DotImpl(a, a, n); }

void AxpyImpl(float alpha, const float* x, float* y, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto va = hn::Set(d, alpha);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  }
  for (; i < n; ++i) y[i] += alpha * x[i];
}

void ScaleImpl(float alpha, float* y, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto va = hn::Set(d, alpha);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Mul(va, hn::LoadU(d, y + i)), d, y + i);
  for (; i < n; ++i) y[i] *= alpha;
}

void RotateHalvesImpl(float* x, const float* cos, const float* sin, int64_t half) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= half; i += lanes) {
    const auto x1 = hn::LoadU(d, x + i);
    const auto x2 = hn::LoadU(d, x + half + i);
    const auto c = hn::LoadU(d, cos + i);
    const auto s = hn::LoadU(d, sin + i);
    hn::StoreU(hn::Sub(hn::Mul(x1, c), hn::Mul(x2, s)), d, x + i);
    hn::StoreU(hn::Add(hn::Mul(x2, c), hn::Mul(x1, s)), d, x + half + i);
  }
  for (; i < half; ++i) {
    const float x1 = x[i];
    const float x2 = x[i + half];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

uint64_t XorWordsImpl(const void* data, int64_t bytes) {
  const hn::ScalableTag<uint64_t> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto* w = static_cast<const uint64_t*>(data);
  const int64_t n = bytes / 8;
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    a0 = hn::Xor(a0, hn::LoadU(d, w + i));
    a1 = hn::Xor(a1, hn::LoadU(d, w + i + lanes));
    a2 = hn::Xor(a2, hn::LoadU(d, w + i + 2 * lanes));
    a3 = hn::Xor(a3, hn::LoadU(d, w + i + 3 * lanes));
  }
  const auto a = hn::Xor(hn::Xor(a0, a1), hn::Xor(a2, a3));
  uint64_t x = 0;
  for (int64_t l = 0; l < lanes; ++l) x ^= hn::ExtractLane(a, static_cast<size_t>(l));
  for (; i < n; ++i) x ^= w[i];
  return x;
}

void SiluMulRangeImpl(const float* gate, const float* up, float* out, int64_t n) {
  using DF = hn::ScalableTag<float>;
  using VF = hn::Vec<DF>;
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VF one = hn::Set(d, 1.0f);
  const VF max_arg = hn::Set(d, 104.0f);  // Exp's range; e^104 is +inf in float, as std::exp
  auto silu_mul = [&](VF g, VF u) {
    return hn::Mul(hn::Div(g, hn::Add(one, hn::Exp(d, hn::Min(hn::Neg(g), max_arg)))), u);
  };
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(silu_mul(hn::LoadU(d, gate + i), hn::LoadU(d, up + i)), d, out + i);
  }
  if (i < n) {  // the tail through a full vector, lane for lane the same operations
    HWY_ALIGN float g[HWY_LANES(float)] = {}, u[HWY_LANES(float)] = {}, o[HWY_LANES(float)];
    for (int64_t t = 0; t < n - i; ++t) {
      g[t] = gate[i + t];
      u[t] = up[i + t];
    }
    hn::Store(silu_mul(hn::Load(d, g), hn::Load(d, u)), d, o);
    for (int64_t t = 0; t < n - i; ++t) out[i + t] = o[t];
  }
}

void ExpShiftScaleImpl(const double* x, double* out, int64_t n, double shift, double scale) {
  using DD = hn::ScalableTag<double>;
  using VD = hn::Vec<DD>;
  const DD d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VD vshift = hn::Set(d, shift), vscale = hn::Set(d, scale);
  const VD neg_inf = hn::Set(d, -HUGE_VAL);
  auto exp = [&](VD v) {
    return hn::IfThenZeroElse(hn::Eq(v, neg_inf), hn::Exp(d, hn::Mul(hn::Sub(v, vshift), vscale)));
  };
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(exp(hn::LoadU(d, x + i)), d, out + i);
  if (i < n) {  // the tail through a full vector, lane for lane the same operations
    HWY_ALIGN double v[HWY_LANES(double)] = {}, o[HWY_LANES(double)];
    for (int64_t t = 0; t < n - i; ++t) v[t] = x[i + t];
    hn::Store(exp(hn::Load(d, v)), d, o);
    for (int64_t t = 0; t < n - i; ++t) out[i + t] = o[t];
  }
}

double SumExpScaledImpl(const float* x, int64_t n, double scale, double shift) {
  using DD = hn::ScalableTag<double>;
  using VD = hn::Vec<DD>;
  const DD d;
  const hn::Rebind<float, DD> df;  // half a vector of floats, one per double lane
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const VD vshift = hn::Set(d, shift), vscale = hn::Set(d, scale);
  auto exp = [&](VD v) { return hn::Exp(d, hn::Sub(hn::Mul(v, vscale), vshift)); };
  VD sum = hn::Zero(d);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    sum = hn::Add(sum, exp(hn::PromoteTo(d, hn::LoadU(df, x + i))));
  if (i < n) {  // the tail's lanes through a full vector; the lanes past it add nothing
    HWY_ALIGN double v[HWY_LANES(double)] = {};
    for (int64_t t = 0; t < n - i; ++t) v[t] = static_cast<double>(x[i + t]);
    const VD e = exp(hn::Load(d, v));
    sum = hn::Add(sum, hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(n - i)), e));
  }
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

}  // namespace HWY_NAMESPACE
}  // namespace rl::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rl::kernels::cpu {

HWY_EXPORT(DotImpl);
HWY_EXPORT(SumSquaresImpl);
HWY_EXPORT(AxpyImpl);
HWY_EXPORT(ScaleImpl);
HWY_EXPORT(XorWordsImpl);
HWY_EXPORT(RotateHalvesImpl);
HWY_EXPORT(SiluMulRangeImpl);
HWY_EXPORT(ExpShiftScaleImpl);
HWY_EXPORT(SumExpScaledImpl);

float Dot(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(DotImpl)(a, b, n);
}
float SumSquares(const float* a, int64_t n) { return HWY_DYNAMIC_DISPATCH(SumSquaresImpl)(a, n); }
void Axpy(float alpha, const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AxpyImpl)(alpha, x, y, n);
}
void Scale(float alpha, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(ScaleImpl)(alpha, y, n); }
void RotateHalves(float* x, const float* cos, const float* sin, int64_t half) {
  HWY_DYNAMIC_DISPATCH(RotateHalvesImpl)(x, cos, sin, half);
}
uint64_t XorWords(const void* data, int64_t bytes) {
  return bytes < 8 ? 0 : HWY_DYNAMIC_DISPATCH(XorWordsImpl)(data, bytes);
}

void SiluMulRange(const float* gate, const float* up, float* out, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(SiluMulRangeImpl)(gate, up, out, n);
}

void ExpShiftScale(const double* x, double* out, int64_t n, double shift, double scale) {
  HWY_DYNAMIC_DISPATCH(ExpShiftScaleImpl)(x, out, n, shift, scale);
}
double SumExpScaled(const float* x, int64_t n, double scale, double shift) {
  return HWY_DYNAMIC_DISPATCH(SumExpScaledImpl)(x, n, scale, shift);
}

}  // namespace rl::kernels::cpu
#endif  // HWY_ONCE
