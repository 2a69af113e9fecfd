// What the CPU under the process reports (CPUID, the OS's cache sizes, Highway's dispatch) and
// the kernel plan chosen from it once per process. The plan changes speed only, never results:
// every choice it makes (tiles, blocking) keeps each element's operations and their order, so
// logits do not depend on it.
//
//   exact matmul        Highway's dispatch picks the target (AVX3 on AVX-512 CPUs: 6 x 4 tiles,
//                       the horizontal sums of 16 dot products at a time, reduce_avx512.h)
//   bf16 products       AVX512-BF16 8 x 3 tiles (matmul_bf16.h) where the CPU has them; the rate
//                       of vdpbf16ps against the float32 FMA from the microarchitecture: 2x on
//                       AMD Zen 4 / Zen 5 (the mode pays off), 1x on Intel Sapphire / Emerald /
//                       Granite Rapids (port 0 only: it does not), unknown elsewhere
//   blocking            the L1d and L2 sizes per core bound the bf16 x rows a block keeps in L1
//                       and the weight slab kept in L2
//   AMX                 reported when CPUID has it; no kernel uses it (none could be tested)
// Cost: CPUID and sysconf once per process (function-local statics).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rl::kernels::cpu {

struct CpuInfo {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ... ("" off x86)
  std::string brand;   // the model name CPUID reports
  int family = 0;      // displayed family and model (extended fields folded in)
  int model = 0;
  std::string microarchitecture = "unknown";
  bool avx2 = false;
  bool fma = false;
  bool avx512 = false;  // F, BW, VL and DQ, with the OS saving the zmm state
  bool avx512_bf16 = false;
  bool amx_bf16 = false;       // CPUID says so; the OS may still refuse the tile state
  int64_t l1d_bytes = 0;       // per core
  int64_t l2_bytes = 0;        // per core
  std::string highway_target;  // the target Highway dispatches the portable kernels to

  // "AMD EPYC (zen5, family 26 model 2), Highway AVX3, AVX-512, AVX512-BF16, no AMX, L1d 48 KiB,
  // L2 1024 KiB"
  std::string Describe() const;
};

// The CPU this process runs on (detected once).
const CpuInfo& GetCpuInfo();

// How the CPU kernels run on a CpuInfo. Default-constructed: the blocking the kernels were
// first tuned with (Sapphire Rapids: 48 KiB L1d, 2 MiB L2), nothing known about the CPU.
struct KernelPlan {
  std::string microarchitecture = "unknown";
  std::string highway_target = "unknown";  // where the exact (portable) kernels run
  bool bf16_products = false;              // AVX512-BF16 tiles available
  // vdpbf16ps products per cycle against the float32 FMA's (0: unknown); the bf16-products
  // mode pays off where it is 2.
  int bf16_products_rate = 0;
  // Bytes of bf16 x rows a block of rows keeps in L1 while it passes over a slab (above: k in
  // chunks), and bytes of weights in a slab kept in L2 while every block passes over it.
  int64_t x_block_bytes = int64_t{24} << 10;
  int64_t slab_bytes = int64_t{256} << 10;

  // One line for logs: "exact matmul: Highway AVX3 tiles; bf16 products: ...".
  std::string Describe() const;
};

// The plan for `info` (a pure function, tested on made-up CPUs).
KernelPlan PlanFor(const CpuInfo& info);
// PlanFor(GetCpuInfo()), once per process.
const KernelPlan& GetKernelPlan();

// The Highway targets the CPU kernels are compiled for and this CPU supports, best first (on an
// AVX-512 CPU: AVX3, AVX2, SSE2): what a test passes, one at a time, to
// hwy::SetSupportedTargetsForTest to run every kernel path this CPU can take. Call it before
// restricting the targets (it reads the supported set).
std::vector<int64_t> CompiledAndSupportedTargets();

}  // namespace rl::kernels::cpu
