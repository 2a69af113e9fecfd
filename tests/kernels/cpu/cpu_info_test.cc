// The CPU facts and the kernel plan (kernels/cpu/cpu_info.h): the plan for made-up CPUs, this
// CPU's facts, and that what the plan changes (tiles, blocking, batched reductions) never
// changes a result's bits.
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/model_io/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"
#include "kernels/cpu/reduce_avx512.h"
#include "kernels/cpu/thread_pool.h"

namespace rl::kernels::cpu {
namespace {

CpuInfo MadeUp(const std::string& vendor, int family, int model, bool bf16) {
  CpuInfo info;
  info.vendor = vendor;
  info.family = family;
  info.model = model;
  info.avx512 = true;
  info.avx512_bf16 = bf16;
  info.highway_target = "AVX3";
  info.l1d_bytes = 48 << 10;
  info.l2_bytes = 1 << 20;
  return info;
}

TEST(KernelPlanTest, Bf16ProductsRateAndBlockingPerCpu) {
  CpuInfo zen5 = MadeUp("AuthenticAMD", 26, 2, true);
  zen5.microarchitecture = "zen5";
  KernelPlan plan = PlanFor(zen5);
  EXPECT_EQ(plan.bf16_products_rate, 2);
  EXPECT_TRUE(plan.bf16_products);
  EXPECT_EQ(plan.x_block_bytes, 32 << 10);  // two thirds of L1d
  EXPECT_EQ(plan.slab_bytes, 256 << 10);    // a quarter of L2
  EXPECT_NE(plan.Describe().find("2x the float32 FMA rate on zen5"), std::string::npos)
      << plan.Describe();

  CpuInfo spr = MadeUp("GenuineIntel", 6, 0x8F, true);
  spr.microarchitecture = "sapphire-rapids";
  spr.l2_bytes = 2 << 20;
  plan = PlanFor(spr);
  EXPECT_EQ(plan.bf16_products_rate, 1);
  EXPECT_EQ(plan.slab_bytes, 512 << 10);
  EXPECT_NE(plan.Describe().find("gains nothing"), std::string::npos) << plan.Describe();

  CpuInfo skylake = MadeUp("GenuineIntel", 6, 0x55, false);  // AVX-512 without BF16
  skylake.microarchitecture = "skylake-server";
  plan = PlanFor(skylake);
  EXPECT_FALSE(plan.bf16_products);
  EXPECT_EQ(plan.bf16_products_rate, 0);
  EXPECT_NE(plan.Describe().find("unavailable"), std::string::npos) << plan.Describe();

  CpuInfo odd = MadeUp("SomeVendor", 1, 1, true);  // unknown: the rate is not guessed
  odd.l1d_bytes = 0;                               // nor are absurd cache sizes trusted
  odd.l2_bytes = int64_t{1} << 40;
  plan = PlanFor(odd);
  EXPECT_EQ(plan.bf16_products_rate, 0);
  EXPECT_EQ(plan.x_block_bytes, (16 << 10) * 2 / 3);
  EXPECT_EQ(plan.slab_bytes, (4 << 20) / 4);
}

TEST(CpuInfoTest, ThisCpu) {
  const CpuInfo& info = GetCpuInfo();
  EXPECT_GT(info.l1d_bytes, 0);
  EXPECT_GT(info.l2_bytes, 0);
  EXPECT_FALSE(info.highway_target.empty());
  EXPECT_EQ(&info, &GetCpuInfo());  // detected once
#if defined(__x86_64__)
  EXPECT_FALSE(info.vendor.empty());
  EXPECT_GT(info.family, 0);
  EXPECT_EQ(Bf16ProductsSupported(), info.avx512_bf16);
  if (info.avx512) EXPECT_EQ(info.highway_target, "AVX3");
#endif
  const std::string line = info.Describe();
  EXPECT_NE(line.find(info.microarchitecture), std::string::npos) << line;
  EXPECT_NE(line.find("Highway " + info.highway_target), std::string::npos) << line;
  std::printf("cpu: %s\nkernels: %s\n", line.c_str(), GetKernelPlan().Describe().c_str());
}

// Sixteen horizontal sums at once equal _mm512_reduce_add_ps of each vector, bit for bit, on
// values whose sums round differently in another order.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) void CheckReductions() {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  alignas(64) float lanes[24][16];
  for (int trial = 0; trial < 200; ++trial) {
    __m512 v[24];
    for (int j = 0; j < 24; ++j) {
      for (int l = 0; l < 16; ++l) lanes[j][l] = std::ldexp(mantissa(rng), exponent(rng));
      v[j] = _mm512_load_ps(lanes[j]);
    }
    float sums[32];
    avx512::ReduceAddEach<24>(v, sums);
    alignas(64) float y[8][3];
    avx512::StoreSums<8, 3>(v, &y[0][0], 3);
    alignas(64) float y4[6][5];  // 6 rows of 4 in a wider array: row stride 5
    avx512::StoreSums<6, 4>(v, &y4[0][0], 5);
    for (int j = 0; j < 24; ++j) {
      const float want = _mm512_reduce_add_ps(v[j]);
      ASSERT_EQ(std::memcmp(&sums[j], &want, 4), 0) << j;
      ASSERT_EQ(std::memcmp(&y[j / 3][j % 3], &want, 4), 0) << j;
      ASSERT_EQ(std::memcmp(&y4[j / 4][j % 4], &want, 4), 0) << j;
    }
  }
}
#endif

TEST(ReduceAvx512Test, ManyAtOnceEqualOneReductionEach) {
  if (!GetCpuInfo().avx512) GTEST_SKIP() << "this CPU has no AVX-512";
#if defined(__x86_64__) && defined(__GNUC__)
  CheckReductions();
#endif
}

// bf16-products mode: the plan's blocking (k chunks carried between passes, slab widths) leaves
// every element's bits alone.
TEST(KernelPlanTest, Bf16ProductsBitsDoNotDependOnBlocking) {
  if (!Bf16ProductsSupported()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  ThreadPool pool(2);
  KernelPlan small = GetKernelPlan();
  small.x_block_bytes = 2 << 10;  // 8 rows x 128 bf16: k in chunks of 128
  small.slab_bytes = 16 << 10;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{19, 53, 1000},
                         {8, 48, 2048},
                         {2, 24, 96},
                         {35, 7, 31}}) {
    SCOPED_TRACE(::testing::Message() << m << " x " << n << " x " << k);
    std::vector<float> x(static_cast<size_t>(m * k)), wf(static_cast<size_t>(n * k));
    for (float& v : x) v = dist(rng);
    for (float& v : wf) v = 0.05f * dist(rng);
    std::vector<uint16_t> w(wf.size());
    model_io::ConvertFromF32(wf.data(), static_cast<int64_t>(wf.size()), model_io::DType::kBF16,
                             w.data());
    std::vector<float> a(static_cast<size_t>(m * n)), b(a.size());
    MatmulParams p;
    p.x = x.data();
    p.w = w.data();
    p.w_dtype = model_io::DType::kBF16;
    p.m = m;
    p.n = n;
    p.k = k;
    p.y = a.data();
    MatmulGroupBf16Products(absl::MakeConstSpan(&p, 1), nullptr, GetKernelPlan());
    p.y = b.data();
    MatmulGroupBf16Products(absl::MakeConstSpan(&p, 1), &pool, small);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace rl::kernels::cpu
