// SIMD targets in tests: every Highway target the CPU kernels are compiled for and this CPU
// supports (best first), as gtest parameters with readable names, and a scope in which the
// kernels dispatch to one of them only. Model-level tests (goldens, batch invariance) run once per
// target, so each kernel path the CPU can take (AVX-512 with its asm tiles, AVX2, the SSE2
// baseline) keeps the exactness contract, not only the one the machine picks by default.
// Cost: each parameterised test runs once per target (three on an AVX-512 CPU).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "kernels/cpu/cpu_info.h"

namespace rl::testing {

// The targets, best first; read before any ScopedSimdTarget restricts them.
inline std::vector<int64_t> SimdTargets() {
  kernels::cpu::GetCpuInfo();  // its Highway target is read once, unrestricted
  return kernels::cpu::CompiledAndSupportedTargets();
}

inline std::string SimdTargetName(int64_t target) { return hwy::TargetName(target); }

// Within the scope the kernels dispatch to `target` only; the best target comes back at its end.
class ScopedSimdTarget {
 public:
  explicit ScopedSimdTarget(int64_t target) { hwy::SetSupportedTargetsForTest(target); }
  ~ScopedSimdTarget() { hwy::SetSupportedTargetsForTest(0); }
  ScopedSimdTarget(const ScopedSimdTarget&) = delete;
  ScopedSimdTarget& operator=(const ScopedSimdTarget&) = delete;
};

}  // namespace rl::testing
