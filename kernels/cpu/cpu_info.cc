#include "kernels/cpu/cpu_info.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "hwy/highway.h"
#include "hwy/targets.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#define RL_X86_CPUID 1
#else
#define RL_X86_CPUID 0
#endif

namespace rl::kernels::cpu {

namespace {

#if RL_X86_CPUID
struct Regs {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Regs Cpuid(unsigned leaf, unsigned subleaf = 0) {
  Regs r;
  if (__get_cpuid_max(leaf & 0x80000000u, nullptr) < leaf) return r;
  __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}
#endif

// The microarchitecture for a vendor, family and model, where the kernels care about it.
std::string Microarchitecture(const std::string& vendor, int family, int model) {
  if (vendor == "AuthenticAMD" || vendor == "HygonGenuine") {
    if (family == 0x1A) return "zen5";
    if (family == 0x19) {
      // Zen 4: Genoa / Bergamo / Siena (0x10-0x1F, 0xA0-0xAF), Raphael and Phoenix (0x60-0x7F).
      if ((model >= 0x10 && model <= 0x1F) || (model >= 0x60 && model <= 0x7F) ||
          (model >= 0xA0 && model <= 0xAF)) {
        return "zen4";
      }
      return "zen3";
    }
    if (family == 0x17) return "zen2";
    return "unknown";
  }
  if (vendor == "GenuineIntel" && family == 6) {
    switch (model) {
      case 0x8F:
        return "sapphire-rapids";
      case 0xCF:
        return "emerald-rapids";
      case 0xAD:
      case 0xAE:
        return "granite-rapids";
      case 0x6A:
      case 0x6C:
        return "icelake-server";
      case 0x55:
        return "skylake-server";
      default:
        return "unknown";
    }
  }
  return "unknown";
}

int64_t CacheBytes(int name, int64_t fallback) {
  const long v = sysconf(name);
  return v > 0 ? static_cast<int64_t>(v) : fallback;
}

CpuInfo Detect() {
  CpuInfo info;
#if RL_X86_CPUID
  const Regs v = Cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor, &v.ebx, 4);
  std::memcpy(vendor + 4, &v.edx, 4);
  std::memcpy(vendor + 8, &v.ecx, 4);
  info.vendor = vendor;
  const Regs one = Cpuid(1);
  const int base_family = static_cast<int>((one.eax >> 8) & 0xF);
  const int base_model = static_cast<int>((one.eax >> 4) & 0xF);
  info.family =
      base_family == 0xF ? base_family + static_cast<int>((one.eax >> 20) & 0xFF) : base_family;
  info.model = (base_family == 0x6 || base_family == 0xF)
                   ? base_model | static_cast<int>(((one.eax >> 16) & 0xF) << 4)
                   : base_model;
  char brand[49] = {};
  if (__get_cpuid_max(0x80000000u, nullptr) >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i) {
      const Regs b = Cpuid(0x80000002u + i);
      std::memcpy(brand + 16 * i, &b.eax, 4);
      std::memcpy(brand + 16 * i + 4, &b.ebx, 4);
      std::memcpy(brand + 16 * i + 8, &b.ecx, 4);
      std::memcpy(brand + 16 * i + 12, &b.edx, 4);
    }
  }
  info.brand = std::string(absl::StripAsciiWhitespace(brand));
  info.microarchitecture = Microarchitecture(info.vendor, info.family, info.model);
  __builtin_cpu_init();  // these also check that the OS saves the vector state
  info.avx2 = __builtin_cpu_supports("avx2");
  info.fma = __builtin_cpu_supports("fma");
  info.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  info.avx512_bf16 = info.avx512 && __builtin_cpu_supports("avx512bf16");
  info.amx_bf16 = (Cpuid(7).edx >> 22) & 1;
#endif
  info.l1d_bytes = CacheBytes(_SC_LEVEL1_DCACHE_SIZE, int64_t{32} << 10);
  info.l2_bytes = CacheBytes(_SC_LEVEL2_CACHE_SIZE, int64_t{1} << 20);
  const int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  info.highway_target = targets != 0 ? hwy::TargetName(targets & -targets) : "none";
  return info;
}

}  // namespace

std::string CpuInfo::Describe() const {
  std::string out = brand.empty() ? "unknown CPU" : brand;
  absl::StrAppend(&out, " (", microarchitecture, ", family ", family, " model ", model,
                  "), Highway ", highway_target);
  if (avx512) absl::StrAppend(&out, ", AVX-512");
  if (avx512_bf16) absl::StrAppend(&out, ", AVX512-BF16");
  absl::StrAppend(&out, amx_bf16 ? ", AMX-BF16 (unused)" : ", no AMX");
  absl::StrAppend(&out, ", L1d ", l1d_bytes >> 10, " KiB, L2 ", l2_bytes >> 10, " KiB");
  return out;
}

std::string KernelPlan::Describe() const {
  std::string out = absl::StrCat("exact matmul: Highway ", highway_target, " tiles");
  if (highway_target == "AVX3") {
    absl::StrAppend(&out,
                    " (BF16 weights: hand-scheduled 6x4 / 2x8, 1x4 for one row, 16 horizontal sums "
                    "at once)");
  }
  absl::StrAppend(&out, "; bf16 products: ");
  if (!bf16_products) return absl::StrCat(out, "unavailable (no AVX512-BF16)");
  absl::StrAppend(&out, "AVX512-BF16 8x3 tiles, ");
  if (bf16_products_rate == 0) {
    absl::StrAppend(&out, "vdpbf16ps rate unknown on this CPU");
  } else {
    absl::StrAppend(&out, "vdpbf16ps at ", bf16_products_rate, "x the float32 FMA rate on ",
                    microarchitecture,
                    bf16_products_rate > 1 ? " (--cpu-bf16-products pays off)"
                                           : " (--cpu-bf16-products gains nothing here)");
  }
  absl::StrAppend(&out, ", x blocks of ", x_block_bytes >> 10, " KiB, weight slabs of ",
                  slab_bytes >> 10, " KiB");
  return out;
}

KernelPlan PlanFor(const CpuInfo& info) {
  KernelPlan plan;
  plan.microarchitecture = info.microarchitecture;
  plan.highway_target = info.highway_target;
  plan.bf16_products = info.avx512_bf16;
  const std::string& arch = info.microarchitecture;
  if (info.avx512_bf16) {
    if (arch == "zen4" || arch == "zen5") {
      plan.bf16_products_rate = 2;
    } else if (arch == "sapphire-rapids" || arch == "emerald-rapids" || arch == "granite-rapids") {
      plan.bf16_products_rate = 1;
    }
  }
  // Two thirds of L1d for a block's x rows (the rest: the current and the prefetched weight
  // tile), a quarter of L2 for a slab (the rest: x blocks streaming through).
  const int64_t l1 = std::clamp<int64_t>(info.l1d_bytes, 16 << 10, 128 << 10);
  const int64_t l2 = std::clamp<int64_t>(info.l2_bytes, 256 << 10, 4 << 20);
  plan.x_block_bytes = l1 * 2 / 3;
  plan.slab_bytes = l2 / 4;
  return plan;
}

const KernelPlan& GetKernelPlan() {
  static const KernelPlan plan = PlanFor(GetCpuInfo());
  return plan;
}

std::vector<int64_t> CompiledAndSupportedTargets() {
  // HWY_TARGETS here is the kernels' set (this file shares their HWY_DISABLED_TARGETS).
  return hwy::SupportedAndGeneratedTargets();
}

const CpuInfo& GetCpuInfo() {
  static const CpuInfo info = Detect();
  return info;
}

}  // namespace rl::kernels::cpu
