// Every CPU kernel against a plain double-precision reference with a declared tolerance, plus
// the batch-invariance property of matmul (a row's bits do not depend on m or threads).
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/model_io/dtype.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/silu_mul.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_ops.h"
#include "tests/testing/numeric.h"

namespace rl::kernels::cpu {
namespace {

using model_io::DType;
using ::rl::testing::Random;

// Stores `f` in `dtype` and returns the raw bytes plus the values as actually stored.
std::vector<uint8_t> Store(const std::vector<float>& f, DType dtype, std::vector<float>* stored) {
  std::vector<uint8_t> raw(f.size() * model_io::DTypeSize(dtype));
  model_io::ConvertFromF32(f.data(), static_cast<int64_t>(f.size()), dtype, raw.data());
  stored->resize(f.size());
  model_io::ConvertToF32(dtype, raw.data(), static_cast<int64_t>(f.size()), stored->data());
  return raw;
}

TEST(ThreadPoolTest, CoversRangeOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 5, 100}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      for (int rep = 0; rep < 50; ++rep) {
        pool.ParallelFor(n, [&](int64_t b, int64_t e, int t) {
          EXPECT_LT(t, threads);
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
      }
      for (int h : hits) EXPECT_EQ(h, 50);
    }
  }
}

TEST(VecOpsTest, MatchReference) {
  for (int64_t n : {1, 7, 8, 9, 31, 128, 1000}) {
    auto a = Random(static_cast<size_t>(n), 1);
    auto b = Random(static_cast<size_t>(n), 2);
    double dot = 0, sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      dot += static_cast<double>(a[i]) * b[i];
      sq += static_cast<double>(a[i]) * a[i];
    }
    EXPECT_NEAR(Dot(a.data(), b.data(), n), dot, 1e-4 * std::sqrt(static_cast<double>(n)));
    EXPECT_NEAR(SumSquares(a.data(), n), sq, 1e-4 * sq);
    auto y = b;
    Axpy(0.5f, a.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], b[i] + 0.5 * a[i], 1e-6);
  }
}

TEST(VecOpsTest, XorWordsMatchesScalar) {
  for (int64_t words : {0, 1, 7, 31, 32, 33, 1000}) {
    std::vector<uint64_t> w(static_cast<size_t>(words) + 1);
    uint64_t expected = 0;
    for (int64_t i = 0; i < words; ++i) {
      w[static_cast<size_t>(i)] = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1);
      expected ^= w[static_cast<size_t>(i)];
    }
    w[static_cast<size_t>(words)] = 0xFFFFFFFFull;  // only its first 3 bytes are in range
    EXPECT_EQ(XorWords(w.data(), words * 8 + 3), expected) << words;
  }
}

// The sampler's exponentials: within 2 ULP of std::exp of the same argument (Highway's Exp: 1),
// -inf to 0, the tail through the same lanes, in place or not, on every target; the normalizer
// within 1e-14 of a loop of std::exp.
TEST(VecOpsTest, ExpShiftScaleAndSumExpScaledMatchStdExpOnEveryTarget) {
  struct ResetTargets {
    ~ResetTargets() { hwy::SetSupportedTargetsForTest(0); }
  } reset;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> x = {-inf,  -2000.0, -999.0, -700.0, -520.0, -495.0,
                           -30.5, -1.0,    -0.0,   0.0,    1e-300, 0.25};
  for (float v : Random(1000, 21, 40.0f)) x.push_back(v - 20.0);  // logits in [-60, 20)
  const std::vector<float> logits = Random(32768 + 5, 22, 30.0f);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{9}, static_cast<int64_t>(x.size())}) {
      const double shift = 1.5, scale = 1.0 / 0.7;
      std::vector<double> out(static_cast<size_t>(n), 7.0);
      ExpShiftScale(x.data(), out.data(), n, shift, scale);
      for (int64_t i = 0; i < n; ++i) {
        const double ref = x[i] == -inf ? 0.0 : std::exp((x[i] - shift) * scale);
        // Subnormal results (arguments below -708) only to within the smallest normal double.
        const double tolerance = ref < std::numeric_limits<double>::min()
                                     ? std::numeric_limits<double>::min()
                                     : 2 * std::numeric_limits<double>::epsilon() * ref;
        ASSERT_LE(std::abs(out[i] - ref), tolerance) << "x " << x[i] << " n " << n;
      }
      std::vector<double> in_place(x.begin(), x.begin() + n);
      ExpShiftScale(in_place.data(), in_place.data(), n, shift, scale);
      ASSERT_EQ(std::memcmp(in_place.data(), out.data(), out.size() * sizeof(double)), 0);
    }
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{32768}, int64_t{32768 + 5}}) {
      const double scale = 1.0 / 0.9, shift = 30.0 / 0.9;
      double ref = 0;
      for (int64_t i = 0; i < n; ++i) ref += std::exp(logits[i] * scale - shift);
      EXPECT_NEAR(SumExpScaled(logits.data(), n, scale, shift), ref, 1e-14 * ref) << n;
    }
  }
}

class MatmulTest : public ::testing::TestWithParam<DType> {};

// Every SIMD target compiled in and supported here (AVX-512 and AVX2 use different tiles).
TEST_P(MatmulTest, MatchesReferenceAndIsBatchInvariant) {
  const DType dtype = GetParam();
  ThreadPool pool(2);
  struct ResetTargets {  // back to the best target, also when an assertion returns early
    ~ResetTargets() { hwy::SetSupportedTargetsForTest(0); }
  } reset;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    for (auto [n, k] :
         {std::pair<int64_t, int64_t>{1, 1}, {5, 7}, {13, 64}, {37, 172}, {64, 513}}) {
      const int64_t max_m = 17;  // 6-, 4- and 1-row tiles (AVX-512), 4- and 1-row (AVX2)
      auto x = Random(static_cast<size_t>(max_m * k), 3);
      std::vector<float> w_stored, b_stored;
      auto w = Store(Random(static_cast<size_t>(n * k), 4, 0.1f), dtype, &w_stored);
      auto bias = Store(Random(static_cast<size_t>(n), 5), dtype, &b_stored);
      std::vector<float> row0;  // row 0 computed with m = 1, 1 thread
      for (int64_t m = 1; m <= max_m; ++m) {
        for (bool with_pool : {false, true}) {
          std::vector<float> y(static_cast<size_t>(m * n), -1.0f);
          MatmulParams p;
          p.x = x.data();
          p.w = w.data();
          p.w_dtype = dtype;
          p.bias = bias.data();
          p.bias_dtype = dtype;
          p.y = y.data();
          p.m = m;
          p.n = n;
          p.k = k;
          ASSERT_TRUE(p.Validate().ok());
          Matmul(p, with_pool ? &pool : nullptr);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double ref = b_stored[j];
              for (int64_t t = 0; t < k; ++t) {
                ref += static_cast<double>(x[i * k + t]) * w_stored[j * k + t];
              }
              ASSERT_NEAR(y[i * n + j], ref, 1e-4 * (1 + std::abs(ref)))
                  << m << " " << n << " " << k;
            }
          }
          if (row0.empty()) row0.assign(y.begin(), y.begin() + n);
          // Every row of x is row (i % ...) — compare row 0's bits across m and threads.
          EXPECT_EQ(std::memcmp(y.data(), row0.data(), n * sizeof(float)), 0) << "m=" << m;
        }
      }
    }
  }
}

// Prefill-sized m and k (many 6-row tiles, then 4-, 2- and 1-row ones, column slabs, a scalar
// tail, leftover columns, two threads): every row must keep the bits it has alone (m = 1).
TEST_P(MatmulTest, PackedPathRowsEqualRowsAlone) {
  const DType dtype = GetParam();
  ThreadPool pool(2);
  struct ResetTargets {
    ~ResetTargets() { hwy::SetSupportedTargetsForTest(0); }
  } reset;
  // k = 1300: rows of x too long for L1, so blocks of rows run over k in chunks. k = 5000: also
  // a prefill's rows in groups (24 rows of x per group at 512 KiB: m = 53 and 100 end with a
  // group of 5 and 4 rows).
  for (const int64_t k : {600, 1300, 5000}) {
    const int64_t n = 43, max_m = 100;
    auto x = Random(static_cast<size_t>(max_m * k), 6);
    std::vector<float> w_stored;
    auto w = Store(Random(static_cast<size_t>(n * k), 7, 0.1f), dtype, &w_stored);
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      SCOPED_TRACE(::testing::Message() << hwy::TargetName(target) << " k=" << k);
      hwy::SetSupportedTargetsForTest(target);
      MatmulParams p;
      p.w = w.data();
      p.w_dtype = dtype;
      p.n = n;
      p.k = k;
      std::vector<float> alone(static_cast<size_t>(max_m * n));
      for (int64_t i = 0; i < max_m; ++i) {
        p.x = x.data() + i * k;
        p.y = alone.data() + i * n;
        p.m = 1;
        Matmul(p, nullptr);
        for (int64_t j = 0; j < n; ++j) {
          double ref = 0;
          for (int64_t t = 0; t < k; ++t) {
            ref += static_cast<double>(x[i * k + t]) * w_stored[j * k + t];
          }
          ASSERT_NEAR(alone[i * n + j], ref, 1e-4 * (1 + std::abs(ref))) << i << " " << j;
        }
      }
      for (int64_t m : {6, 47, 53, 100}) {
        std::vector<float> y(static_cast<size_t>(m * n), -1.0f);
        p.x = x.data();
        p.y = y.data();
        p.m = m;
        ASSERT_TRUE(p.Validate().ok());
        Matmul(p, &pool);
        EXPECT_EQ(std::memcmp(y.data(), alone.data(), y.size() * sizeof(float)), 0) << "m=" << m;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, MatmulTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16));

// The exact kernel's arithmetic, spelled out for Highway's AVX3 target (16 lanes; BF16 weights
// read as (even, odd) pairs): per element, lane l adds x[32b + 2l] · w then x[32b + 2l + 1] · w
// for every whole block b in order (fused multiply-adds), the lanes are summed as
// _mm512_reduce_add_ps does (l + (l + 8), then + 4, + 2, + 1), the tail adds its products in
// order (rounded products), then the bias. Every tile the kernel may pick (hand-written asm for
// BF16 weights, Highway's for the rest), every row block, k chunk and thread count must give
// exactly these bits; a kernel that reorders anything fails here.
float ModelOfAvx3Dot(const float* x, const float* w, int64_t k, float bias) {
  float acc[16] = {};
  const int64_t kvec = k - k % 32;
  for (int64_t b = 0; b < kvec; b += 32) {
    for (int l = 0; l < 16; ++l) acc[l] = std::fmaf(x[b + 2 * l], w[b + 2 * l], acc[l]);
    for (int l = 0; l < 16; ++l) acc[l] = std::fmaf(x[b + 2 * l + 1], w[b + 2 * l + 1], acc[l]);
  }
  float s8[8], s4[4], s2[2];
  for (int i = 0; i < 8; ++i) s8[i] = acc[i] + acc[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
  float sum = s2[0] + s2[1];
  for (int64_t i = kvec; i < k; ++i) {
    const float prod = x[i] * w[i];
    sum += prod;
  }
  return sum + bias;
}

TEST(MatmulTest, Avx3KernelsComputeTheDocumentedOperations) {
  if (GetCpuInfo().highway_target != "AVX3") {
    GTEST_SKIP() << "the model is AVX3's; kernels here run on " << GetCpuInfo().highway_target;
  }
  ThreadPool pool(2);
  // k: whole blocks only (asm tiles, sums stored straight to y), a tail, a k chunked in the
  // 6-row tiles (24 KiB of x rows), a long tail-free k; m: every tile of rows and their mixes;
  // k = 8192 at m = 40: rows in groups of 12 (512 KiB of x each), the bias added per group.
  for (auto [n, k] :
       {std::pair<int64_t, int64_t>{29, 1024}, {24, 1037}, {17, 3072}, {9, 64}, {11, 8192}}) {
    for (int64_t m : {1, 2, 3, 5, 6, 7, 13, 16, 40}) {
      SCOPED_TRACE(::testing::Message() << "m=" << m << " n=" << n << " k=" << k);
      auto x = Random(static_cast<size_t>(m * k), 11);
      std::vector<float> w_stored, b_stored;
      auto w = Store(Random(static_cast<size_t>(n * k), 12, 0.1f), DType::kBF16, &w_stored);
      auto bias = Store(Random(static_cast<size_t>(n), 13), DType::kBF16, &b_stored);
      for (bool with_pool : {false, true}) {
        std::vector<float> y(static_cast<size_t>(m * n));
        MatmulParams p;
        p.x = x.data();
        p.w = w.data();
        p.w_dtype = DType::kBF16;
        p.bias = bias.data();
        p.bias_dtype = DType::kBF16;
        p.y = y.data();
        p.m = m;
        p.n = n;
        p.k = k;
        Matmul(p, with_pool ? &pool : nullptr);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            const float want =
                ModelOfAvx3Dot(x.data() + i * k, w_stored.data() + j * k, k, b_stored[j]);
            ASSERT_EQ(std::memcmp(&y[i * n + j], &want, sizeof(float)), 0)
                << "row " << i << " col " << j << ": " << y[i * n + j] << " vs " << want;
          }
        }
      }
    }
  }
}

// bf16-products mode: x rounded to bf16, bf16 products summed in float32; each row keeps its
// bits whatever m and the threads; F32 weights are refused. Where the CPU has AVX512-BF16.
TEST(MatmulBf16ProductsTest, MatchesBf16ReferenceAndRowsAlone) {
  if (!Bf16ProductsSupported()) {
    MatmulParams p;
    std::vector<float> x(4), y(4);
    std::vector<uint16_t> w(4);
    p.x = x.data();
    p.w = w.data();
    p.w_dtype = DType::kBF16;
    p.y = y.data();
    p.m = p.n = 1;
    p.k = 4;
    EXPECT_EQ(ValidateMatmulGroupBf16Products(absl::MakeConstSpan(&p, 1)).code(),
              absl::StatusCode::kFailedPrecondition);
    GTEST_SKIP() << "this CPU has no AVX512-BF16";
  }
  ThreadPool pool(2);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{13, 37}, {40, 96}, {19, 1300}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " k=" << k);
    const int64_t max_m = 14;
    auto x = Random(static_cast<size_t>(max_m * k), 40);
    std::vector<float> w_stored, b_stored, x_rounded;
    auto w = Store(Random(static_cast<size_t>(n * k), 41, 0.1f), DType::kBF16, &w_stored);
    auto bias = Store(Random(static_cast<size_t>(n), 42), DType::kBF16, &b_stored);
    Store(x, DType::kBF16, &x_rounded);  // x as the kernel rounds it (nearest even)
    MatmulParams p;
    p.x = x.data();
    p.w = w.data();
    p.w_dtype = DType::kBF16;
    p.bias = bias.data();
    p.bias_dtype = DType::kBF16;
    p.n = n;
    p.k = k;
    std::vector<float> alone(static_cast<size_t>(max_m * n));
    for (int64_t i = 0; i < max_m; ++i) {
      p.x = x.data() + i * k;
      p.y = alone.data() + i * n;
      p.m = 1;
      ASSERT_TRUE(ValidateMatmulGroupBf16Products(absl::MakeConstSpan(&p, 1)).ok());
      MatmulGroupBf16Products(absl::MakeConstSpan(&p, 1), nullptr);
      for (int64_t j = 0; j < n; ++j) {
        double ref = b_stored[j], mag = std::abs(b_stored[j]);
        for (int64_t t = 0; t < k; ++t) {
          const double prod = static_cast<double>(x_rounded[i * k + t]) * w_stored[j * k + t];
          ref += prod;
          mag += std::abs(prod);
        }
        ASSERT_NEAR(alone[i * n + j], ref, 1e-5 * (1 + mag)) << i << " " << j;
      }
    }
    std::vector<float> y(static_cast<size_t>(max_m * n), -1.0f);
    p.x = x.data();
    p.y = y.data();
    p.m = max_m;
    MatmulGroupBf16Products(absl::MakeConstSpan(&p, 1), &pool);
    EXPECT_EQ(std::memcmp(y.data(), alone.data(), y.size() * sizeof(float)), 0);
    std::vector<float> wf(static_cast<size_t>(n * k), 0.5f);
    p.w = wf.data();
    p.w_dtype = DType::kF32;
    EXPECT_FALSE(ValidateMatmulGroupBf16Products(absl::MakeConstSpan(&p, 1)).ok());
  }
}

// A group (fused QKV-like: three widths, one with bias) gives the bits of separate Matmuls.
TEST(MatmulGroupTest, BitIdenticalToSeparateMatmuls) {
  ThreadPool pool(3);
  const int64_t k = 96;
  const std::vector<int64_t> widths = {50, 24, 7};
  for (int64_t m : {1, 3, 9}) {
    auto x = Random(static_cast<size_t>(m * k), 6);
    std::vector<std::vector<float>> stored(widths.size());
    std::vector<std::vector<uint8_t>> ws(widths.size());
    std::vector<std::vector<float>> alone(widths.size()), grouped(widths.size());
    std::vector<float> b_stored;
    auto bias = Store(Random(static_cast<size_t>(widths[0]), 8), DType::kBF16, &b_stored);
    std::vector<MatmulParams> group;
    for (size_t i = 0; i < widths.size(); ++i) {
      ws[i] = Store(Random(static_cast<size_t>(widths[i] * k), static_cast<uint32_t>(7 + i), 0.1f),
                    DType::kBF16, &stored[i]);
      alone[i].assign(static_cast<size_t>(m * widths[i]), -1.0f);
      grouped[i].assign(static_cast<size_t>(m * widths[i]), -2.0f);
      MatmulParams p;
      p.x = x.data();
      p.w = ws[i].data();
      p.w_dtype = DType::kBF16;
      if (i == 0) {
        p.bias = bias.data();
        p.bias_dtype = DType::kBF16;
      }
      p.y = alone[i].data();
      p.m = m;
      p.n = widths[i];
      p.k = k;
      Matmul(p, nullptr);
      p.y = grouped[i].data();
      group.push_back(p);
    }
    ASSERT_TRUE(ValidateMatmulGroup(group).ok());
    MatmulGroup(group, &pool);
    for (size_t i = 0; i < widths.size(); ++i) {
      EXPECT_EQ(std::memcmp(alone[i].data(), grouped[i].data(), alone[i].size() * sizeof(float)), 0)
          << "m=" << m << " matmul " << i;
    }
    group[1].m = m + 1;
    EXPECT_FALSE(ValidateMatmulGroup(group).ok());
  }
  EXPECT_FALSE(ValidateMatmulGroup({}).ok());
}

TEST(MatmulValidateTest, RejectsBadParams) {
  MatmulParams p;
  EXPECT_FALSE(p.Validate().ok());
  float x = 0, y = 0;
  int64_t w = 0;
  p.x = &x;
  p.y = &y;
  p.w = &w;
  p.m = 1;
  p.n = 1;
  p.k = 1;
  p.w_dtype = DType::kI64;
  EXPECT_FALSE(p.Validate().ok());
}

TEST(RmsNormTest, MatchesReference) {
  ThreadPool pool(2);
  for (int64_t dim : {8, 64, 172, 1024}) {
    const int64_t rows = 40;
    auto x = Random(static_cast<size_t>(rows * dim), 6);
    std::vector<float> w_stored;
    auto w = Store(Random(static_cast<size_t>(dim), 7), DType::kBF16, &w_stored);
    std::vector<float> y(x.size());
    RmsNormParams p{x.data(), w.data(), DType::kBF16, y.data(), rows, dim, 1e-5f};
    ASSERT_TRUE(p.Validate().ok());
    RmsNorm(p, &pool);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int64_t i = 0; i < dim; ++i) {
        ASSERT_NEAR(y[r * dim + i], x[r * dim + i] * inv * w_stored[i], 1e-5);
      }
    }
    RmsNorm(p, &pool);  // in place also works
    RmsNormParams in_place = p;
    in_place.y = x.data();
    RmsNorm(in_place, &pool);
    EXPECT_EQ(std::memcmp(x.data(), y.data(), y.size() * sizeof(float)), 0);
  }
}

// The fused residual add + norm gives the bits of the add followed by the norm, with the
// transformer's aliasing (delta is the norm's output buffer), alone or on two threads.
TEST(RmsNormTest, AddRmsNormEqualsAddThenNorm) {
  ThreadPool pool(2);
  for (int64_t rows : {1, 3, 40}) {
    const int64_t dim = 1024;
    const auto x0 = Random(static_cast<size_t>(rows * dim), 16);
    const auto delta0 = Random(static_cast<size_t>(rows * dim), 17);
    std::vector<float> w_stored;
    auto w = Store(Random(static_cast<size_t>(dim), 18), DType::kBF16, &w_stored);
    // Separately: x += delta, then y = RmsNorm(x).
    std::vector<float> x_sep = x0, y_sep(x0.size());
    for (size_t i = 0; i < x_sep.size(); ++i) x_sep[i] += delta0[i];
    RmsNormParams sep{x_sep.data(), w.data(), DType::kBF16, y_sep.data(), rows, dim, 1e-5f};
    RmsNorm(sep, nullptr);
    for (ThreadPool* with : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<float> x = x0, h = delta0;  // h: delta in, the norm out
      RmsNormParams p{x.data(), w.data(), DType::kBF16, h.data(), rows, dim, 1e-5f};
      AddRmsNorm(h.data(), p, with);
      EXPECT_EQ(std::memcmp(x.data(), x_sep.data(), x.size() * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(h.data(), y_sep.data(), h.size() * sizeof(float)), 0);
    }
  }
}

TEST(RopeTest, RotatesHalves) {
  const int64_t t = 3, hq = 2, hk = 1, d = 8, half = 4;
  auto q = Random(static_cast<size_t>(t * hq * d), 8);
  auto k = Random(static_cast<size_t>(t * hk * d), 9);
  auto q0 = q, k0 = k;
  std::vector<float> cos(t * half), sin(t * half);
  for (int64_t i = 0; i < t * half; ++i) {
    cos[i] = std::cos(0.1f * static_cast<float>(i));
    sin[i] = std::sin(0.1f * static_cast<float>(i));
  }
  RopeParams p{q.data(), k.data(), cos.data(), sin.data(), t, hq, hk, d, hq * d, hk * d};
  ASSERT_TRUE(p.Validate().ok());
  Rope(p, nullptr);
  for (int64_t tok = 0; tok < t; ++tok) {
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        const float* x = &q0[(tok * hq + h) * d];
        const float c = cos[tok * half + i], s = sin[tok * half + i];
        EXPECT_NEAR(q[(tok * hq + h) * d + i], x[i] * c - x[i + half] * s, 1e-6);
        EXPECT_NEAR(q[(tok * hq + h) * d + i + half], x[i + half] * c + x[i] * s, 1e-6);
      }
    }
  }
  RopeParams odd = p;
  odd.head_dim = 7;
  EXPECT_FALSE(odd.Validate().ok());
}

// The vectorized rotation has the scalar formula's bits (two rounded products, then their
// rounded difference or sum) on every target, head dims with and without a vector tail, 16
// tokens on two threads.
TEST(RopeTest, SameBitsAsTheScalarFormulaOnEveryTarget) {
  ThreadPool pool(2);
  struct ResetTargets {
    ~ResetTargets() { hwy::SetSupportedTargetsForTest(0); }
  } reset;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    for (int64_t d : {128, 72, 6}) {
      const int64_t t = 16, hq = 4, hk = 2, half = d / 2;
      auto q = Random(static_cast<size_t>(t * hq * d), 19);
      auto k = Random(static_cast<size_t>(t * hk * d), 20);
      const auto q0 = q, k0 = k;
      auto cos = Random(static_cast<size_t>(t * half), 21);
      auto sin = Random(static_cast<size_t>(t * half), 22);
      RopeParams p{q.data(), k.data(), cos.data(), sin.data(), t, hq, hk, d, hq * d, hk * d};
      Rope(p, &pool);
      auto check = [&](const std::vector<float>& before, const std::vector<float>& after,
                       int64_t heads) {
        for (int64_t tok = 0; tok < t; ++tok) {
          for (int64_t h = 0; h < heads; ++h) {
            const float* x = &before[(tok * heads + h) * d];
            const float* y = &after[(tok * heads + h) * d];
            for (int64_t i = 0; i < half; ++i) {
              const float c = cos[tok * half + i], s = sin[tok * half + i];
              const float a = x[i] * c, b = x[i + half] * s;
              const float e = x[i + half] * c, f = x[i] * s;
              const float want_lo = a - b, want_hi = e + f;
              ASSERT_EQ(std::memcmp(&y[i], &want_lo, 4), 0) << tok << " " << h << " " << i;
              ASSERT_EQ(std::memcmp(&y[i + half], &want_hi, 4), 0) << tok << " " << h << " " << i;
            }
          }
        }
      };
      check(q0, q, hq);
      check(k0, k, hk);
    }
  }
}

// Attention of every (token, query head) of `p` in double precision from its host buffers
// (float32 KV cache), laid out as p.out: [num_tokens, num_heads, head_dim].
std::vector<double> ReferenceAttention(const AttentionParams& p) {
  const int64_t d = p.head_dim, group = p.num_heads / p.num_kv_heads, kv_dim = p.num_kv_heads * d;
  const auto* kc = static_cast<const float*>(p.k_cache);
  const auto* vc = static_cast<const float*>(p.v_cache);
  std::vector<double> out(static_cast<size_t>(p.num_tokens * p.num_heads * d));
  for (int64_t tok = 0; tok < p.num_tokens; ++tok) {
    const int32_t* slots = p.slots + p.slot_begin[tok];
    const int64_t len = p.context_len[tok];
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const int64_t off = (h / group) * d;
      const float* qr = p.q + tok * p.q_stride + h * d;
      std::vector<double> sc(static_cast<size_t>(len));
      double mx = -1e30, sum = 0;
      for (int64_t j = 0; j < len; ++j) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i)
          dot += static_cast<double>(qr[i]) * kc[slots[j] * kv_dim + off + i];
        sc[j] = dot * p.scale;
        mx = std::max(mx, sc[j]);
      }
      for (double& x : sc) sum += (x = std::exp(x - mx));
      for (int64_t i = 0; i < d; ++i) {
        double ref = 0;
        for (int64_t j = 0; j < len; ++j) ref += sc[j] / sum * vc[slots[j] * kv_dim + off + i];
        out[static_cast<size_t>((tok * p.num_heads + h) * d + i)] = ref;
      }
    }
  }
  return out;
}

TEST(AttentionTest, PagedGqaMatchesReference) {
  ThreadPool pool(2);
  const int64_t hq = 4, hk = 2, d = 16, num_slots = 64, max_ctx = 32;
  const int64_t kv_dim = hk * d;
  auto kc = Random(static_cast<size_t>(num_slots * kv_dim), 10);
  auto vc = Random(static_cast<size_t>(num_slots * kv_dim), 11);
  // Two sequences: lengths 5 (one decode token at pos 4) and 9 (a chunk at pos 6..8).
  std::vector<int32_t> slots = {40, 3, 17, 9, 22, 1, 2, 60, 61, 33, 34, 35, 50, 7};
  std::vector<int32_t> context = {5, 7, 8, 9};
  std::vector<int32_t> begin = {0, 5, 5, 5};
  const int64_t t = 4;
  auto q = Random(static_cast<size_t>(t * hq * d), 12);
  std::vector<float> out(static_cast<size_t>(t * hq * d));
  std::vector<float> ws(static_cast<size_t>(2 * max_ctx));
  AttentionParams p;
  p.q = q.data();
  p.k_cache = kc.data();
  p.v_cache = vc.data();
  p.out = out.data();
  p.context_len = context.data();
  p.slot_begin = begin.data();
  p.slots = slots.data();
  p.workspace = ws.data();
  p.num_workspaces = 2;
  p.num_tokens = t;
  p.num_heads = hq;
  p.num_kv_heads = hk;
  p.head_dim = d;
  p.q_stride = hq * d;
  p.num_slots = num_slots;
  p.num_slot_entries = static_cast<int64_t>(slots.size());
  p.max_context = max_ctx;
  p.scale = 0.25f;
  ASSERT_TRUE(ValidateAttention(p).ok());
  Attention(p, &pool);
  const std::vector<double> ref = ReferenceAttention(p);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5) << i;
  std::vector<int32_t> bad_slots = slots;
  bad_slots[3] = 64;
  p.slots = bad_slots.data();
  EXPECT_FALSE(p.Validate().ok());
  EXPECT_FALSE(ValidateAttention(p).ok());
  p.slots = slots.data();
  context[0] = 40;  // beyond max_context
  EXPECT_FALSE(p.Validate().ok());
  EXPECT_FALSE(ValidateAttention(p).ok());
  context[0] = 5;
  // The backend-neutral checks leave the KV dtype and the workspace to the backend; the CPU
  // kernel's own checks reject what it cannot run.
  p.kv_dtype = DType::kBF16;
  EXPECT_TRUE(p.Validate().ok());
  EXPECT_EQ(ValidateAttention(p).message(), "attention: the CPU KV cache is float32");
  p.kv_dtype = DType::kF32;
  p.workspace = nullptr;
  EXPECT_TRUE(p.ValidateShapes().ok());
  EXPECT_TRUE(p.Validate().ok());
  EXPECT_EQ(ValidateAttention(p).message(), "attention: no workspace");
}

// Contexts and slot-list offsets of a prefill chunk at positions [from, to) of a sequence whose
// slots start at entry 0, then of one decode token attending `decode_len` positions of a
// sequence whose slots start at entry `decode_begin`.
void ChunkThenDecode(int32_t from, int32_t to, int32_t decode_len, int32_t decode_begin,
                     std::vector<int32_t>* context, std::vector<int32_t>* begin) {
  for (int32_t pos = from; pos < to; ++pos) {
    context->push_back(pos + 1);
    begin->push_back(0);
  }
  context->push_back(decode_len);
  begin->push_back(decode_begin);
}

// Runs `p` over tokens [0, t) (2 threads) into *batched, then every token alone (no pool), and
// expects each row to keep the bits it had in the batch.
void ExpectBatchedEqualsAlone(AttentionParams p, const float* q, const int32_t* context,
                              const int32_t* begin, int64_t t, std::vector<float>* batched) {
  const int64_t row = p.num_heads * p.head_dim;
  batched->assign(static_cast<size_t>(t * row), 0.0f);
  p.q = q;
  p.out = batched->data();
  p.context_len = context;
  p.slot_begin = begin;
  p.num_tokens = t;
  ASSERT_TRUE(ValidateAttention(p).ok());
  ThreadPool pool(2);
  Attention(p, &pool);
  for (int64_t tok = 0; tok < t; ++tok) {
    std::vector<float> alone(static_cast<size_t>(row));
    AttentionParams one = p;
    one.q = q + tok * p.q_stride;
    one.out = alone.data();
    one.context_len = context + tok;
    one.slot_begin = begin + tok;
    one.num_tokens = 1;
    Attention(one, nullptr);
    for (int64_t i = 0; i < row; ++i) {
      ASSERT_EQ((*batched)[static_cast<size_t>(tok * row + i)], alone[static_cast<size_t>(i)])
          << "token " << tok << " element " << i;
    }
  }
}

// Query rows of one sequence are attended in shared tiles (several tokens × the heads of a KV
// head); each row must still be bit-identical to the same token attended alone, whatever the
// tile shape: GQA groups of 1, 4 and 16 (more heads than a tile holds), head dims with and
// without a scalar tail, and a workspace small enough to force smaller tiles.
TEST(AttentionTest, TiledRowsEqualRowsAloneBitForBit) {
  struct Case {
    int64_t hq, hk, d, max_ctx;
  };
  for (const Case& c :
       {Case{4, 4, 16, 64}, Case{8, 2, 20, 64}, Case{16, 1, 8, 64}, Case{8, 2, 16, 24}}) {
    SCOPED_TRACE(::testing::Message()
                 << "hq=" << c.hq << " hk=" << c.hk << " d=" << c.d << " max_ctx=" << c.max_ctx);
    const int64_t num_slots = 48, kv_dim = c.hk * c.d;
    auto kc = Random(static_cast<size_t>(num_slots * kv_dim), 20);
    auto vc = Random(static_cast<size_t>(num_slots * kv_dim), 21);
    // Sequence A: a prefill chunk of 9 tokens at positions 3..11; B: one decode token at 6.
    std::vector<int32_t> slots = {5, 9, 2,  30, 31, 7,  8,  40, 41, 42,
                                  1, 0, 20, 21, 22, 23, 24, 25, 26};
    std::vector<int32_t> context, begin;
    ChunkThenDecode(3, 12, 7, 12, &context, &begin);
    const int64_t t = static_cast<int64_t>(context.size());
    auto q = Random(static_cast<size_t>(t * c.hq * c.d), 22);
    std::vector<float> ws(static_cast<size_t>(2 * c.max_ctx));
    AttentionParams p;
    p.k_cache = kc.data();
    p.v_cache = vc.data();
    p.slots = slots.data();
    p.workspace = ws.data();
    p.num_workspaces = 2;
    p.num_heads = c.hq;
    p.num_kv_heads = c.hk;
    p.head_dim = c.d;
    p.q_stride = c.hq * c.d;
    p.num_slots = num_slots;
    p.num_slot_entries = static_cast<int64_t>(slots.size());
    p.max_context = c.max_ctx;
    p.scale = 0.3f;
    std::vector<float> batched;
    ExpectBatchedEqualsAlone(p, q.data(), context.data(), begin.data(), t, &batched);
  }
}

// Contexts longer than a block of score lanes (whole, partial and one-position blocks), head
// dims with and without a scalar tail, on every SIMD target compiled in: each row matches a
// double-precision reference and keeps, in a tile of a prefill chunk, the bits it has alone.
TEST(AttentionTest, LongContextsMatchReferenceAndRowsAloneOnEveryTarget) {
  struct ResetTargets {
    ~ResetTargets() { hwy::SetSupportedTargetsForTest(0); }
  } reset;
  const int64_t hq = 4, hk = 2, num_slots = 96;
  // Sequence A: a prefill chunk of 40 tokens at positions 10..49; B: a decode token at 36.
  std::vector<int32_t> slots(num_slots);
  for (int32_t i = 0; i < num_slots; ++i) slots[i] = (i * 37 + 11) % num_slots;
  std::vector<int32_t> context, begin;
  ChunkThenDecode(10, 50, 37, 50, &context, &begin);
  const int64_t t = static_cast<int64_t>(context.size());
  for (int64_t d : {128, 72}) {
    const int64_t kv_dim = hk * d;
    auto kc = Random(static_cast<size_t>(num_slots * kv_dim), 30);
    auto vc = Random(static_cast<size_t>(num_slots * kv_dim), 31);
    auto q = Random(static_cast<size_t>(t * hq * d), 32);
    std::vector<float> ws(static_cast<size_t>(2 * 4096));
    AttentionParams p;
    p.k_cache = kc.data();
    p.v_cache = vc.data();
    p.slots = slots.data();
    p.workspace = ws.data();
    p.num_workspaces = 2;
    p.num_heads = hq;
    p.num_kv_heads = hk;
    p.head_dim = d;
    p.q_stride = hq * d;
    p.num_slots = num_slots;
    p.num_slot_entries = num_slots;
    p.max_context = 4096;
    p.scale = 1.0f / std::sqrt(static_cast<float>(d));
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      SCOPED_TRACE(::testing::Message() << hwy::TargetName(target) << " d=" << d);
      hwy::SetSupportedTargetsForTest(target);
      std::vector<float> batched;
      ExpectBatchedEqualsAlone(p, q.data(), context.data(), begin.data(), t, &batched);
      AttentionParams all = p;
      all.q = q.data();
      all.context_len = context.data();
      all.slot_begin = begin.data();
      all.num_tokens = t;
      const std::vector<double> ref = ReferenceAttention(all);
      for (size_t i = 0; i < batched.size(); ++i) ASSERT_NEAR(batched[i], ref[i], 1e-5) << i;
    }
  }
}

TEST(WriteKvTest, WritesSlotsAndChecksRange) {
  std::vector<float> k = {1, 2, 3, 4}, v = {5, 6, 7, 8}, kc(8, 0), vc(8, 0);
  std::vector<int32_t> slots = {3, 1};
  WriteKvParams p{k.data(), v.data(), slots.data(), kc.data(), vc.data(), 2, 2, 2, 2, 4};
  ASSERT_TRUE(ValidateWriteKv(p).ok());
  WriteKv(p);
  EXPECT_EQ(kc, (std::vector<float>{0, 0, 3, 4, 0, 0, 1, 2}));
  EXPECT_EQ(vc, (std::vector<float>{0, 0, 7, 8, 0, 0, 5, 6}));
  // A BF16 cache is valid for device backends, not for the CPU kernel (checked before the
  // slots, as before the params moved out of the CPU kernel).
  p.kv_dtype = DType::kBF16;
  EXPECT_TRUE(p.Validate().ok());
  EXPECT_EQ(ValidateWriteKv(p).message(), "write_kv: the CPU KV cache is float32");
  slots[0] = 4;
  EXPECT_EQ(ValidateWriteKv(p).message(), "write_kv: the CPU KV cache is float32");
  p.kv_dtype = DType::kF32;
  EXPECT_EQ(p.Validate().message(), "write_kv: slot 4 out of range [0, 4)");
  EXPECT_EQ(ValidateWriteKv(p).message(), "write_kv: slot 4 out of range [0, 4)");
}

TEST(SiluMulTest, MatchesReference) {
  auto g = Random(100000, 13, 3.0f);
  auto u = Random(100000, 14);
  std::vector<float> out(g.size());
  ThreadPool pool(2);
  SiluMulParams p{g.data(), u.data(), out.data(), static_cast<int64_t>(g.size())};
  ASSERT_TRUE(p.Validate().ok());
  SiluMul(p, &pool);
  for (size_t i = 0; i < g.size(); ++i) {
    const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    ASSERT_NEAR(out[i], ref, 1e-5 * (1 + std::abs(ref)));
  }
}

// Every target, a length with a tail, and gates far outside exp's range: silu(-200) is -0 (e^200
// overflows to +inf), silu(200) is 200; an element's value does not depend on where it sits.
TEST(SiluMulTest, ExtremesAndTailsOnEveryTarget) {
  struct ResetTargets {
    ~ResetTargets() { hwy::SetSupportedTargetsForTest(0); }
  } reset;
  std::vector<float> g = {-200.0f, -104.5f, -88.0f, -1.0f, -0.0f,
                          0.0f,    1e-30f,  1.0f,   20.0f, 200.0f};
  auto extra = Random(27, 16, 4.0f);
  g.insert(g.end(), extra.begin(), extra.end());
  const auto u = Random(g.size(), 17);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    std::vector<float> out(g.size(), 7.0f);
    SiluMulParams p{g.data(), u.data(), out.data(), static_cast<int64_t>(g.size())};
    SiluMul(p, nullptr);
    for (size_t i = 0; i < g.size(); ++i) {
      const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
      ASSERT_NEAR(out[i], ref, 1e-5 * (1 + std::abs(ref))) << "gate " << g[i];
      ASSERT_TRUE(std::isfinite(out[i])) << "gate " << g[i];
      float one = 0.0f;  // the same element alone
      SiluMulParams alone{&g[i], &u[i], &one, 1};
      SiluMul(alone, nullptr);
      ASSERT_EQ(std::memcmp(&one, &out[i], sizeof(float)), 0) << "gate " << g[i];
    }
  }
}

TEST(EmbeddingTest, GathersAndWidens) {
  std::vector<float> stored;
  auto table = Store(Random(5 * 3, 15), DType::kF16, &stored);
  std::vector<int32_t> ids = {4, 0, 4};
  std::vector<float> out(9);
  EmbeddingParams p{table.data(), DType::kF16, ids.data(), out.data(), 3, 5, 3};
  ASSERT_TRUE(p.Validate().ok());
  Embedding(p, nullptr);
  for (int t = 0; t < 3; ++t) {
    for (int i = 0; i < 3; ++i) EXPECT_EQ(out[t * 3 + i], stored[ids[t] * 3 + i]);
  }
  ids[1] = 5;
  EXPECT_FALSE(p.Validate().ok());
  ids[1] = -1;
  EXPECT_FALSE(p.Validate().ok());
}

}  // namespace
}  // namespace rl::kernels::cpu
