// Lane sums of many vectors at once, for the kernels' dot products (Highway per-target header:
// include it after hwy/highway.h inside a file compiled for every target).
//
// SumLanesOfEach(d, v, n) with n = Lanes(d) returns the vector whose lane t is the sum of v[t]'s
// lanes, by a fixed pairwise tree (adjacent lanes first: ((x0 + x1) + (x2 + x3)) + ...) that is
// the same for every t whatever the other vectors hold. It takes n - 1 additions for n sums,
// where a horizontal sum per vector costs about as many operations as a 128-element dot
// product. A kernel that reduces all its dot products this way gives each one the same bits
// whether it was reduced with 1 or Lanes(d) - 1 others: the basis of batch invariance.

#if defined(RL_KERNELS_CPU_LANE_SUMS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RL_KERNELS_CPU_LANE_SUMS_INL_H_
#undef RL_KERNELS_CPU_LANE_SUMS_INL_H_
#else
#define RL_KERNELS_CPU_LANE_SUMS_INL_H_
#endif

#include <cstddef>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace rl::kernels::cpu {
namespace HWY_NAMESPACE {

template <class D, class V = hwy::HWY_NAMESPACE::Vec<D>>
HWY_INLINE V SumLanesOfEach(D d, V* v, size_t n) {
  namespace hn = hwy::HWY_NAMESPACE;
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  (void)n;  // one lane: each vector is its own sum
#else
  for (; n > 1; n /= 2) {
    for (size_t m = 0; m < n / 2; ++m) {
      v[m] = hn::Add(hn::ConcatEven(d, v[2 * m + 1], v[2 * m]),
                     hn::ConcatOdd(d, v[2 * m + 1], v[2 * m]));
    }
  }
#endif
  return v[0];
}

}  // namespace HWY_NAMESPACE
}  // namespace rl::kernels::cpu
HWY_AFTER_NAMESPACE();

#endif  // RL_KERNELS_CPU_LANE_SUMS_INL_H_
