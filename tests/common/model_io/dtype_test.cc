#include "common/model_io/dtype.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace rl::model_io {
namespace {

TEST(DTypeTest, NamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kBool}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_FALSE(ParseDType("F8_E4M3X").has_value());
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_TRUE(IsFloatWeightDType(DType::kF16));
  EXPECT_FALSE(IsFloatWeightDType(DType::kI64));
}

TEST(DTypeTest, Bf16RoundTripAndRounding) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 0.001953125f, 65536.0f}) {
    EXPECT_EQ(Bf16ToF32(F32ToBf16(f)), f) << f;
  }
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::nanf("")))));
}

TEST(DTypeTest, F16RoundTripAllValues) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f))));
      continue;
    }
    EXPECT_EQ(F32ToF16(f), h) << std::hex << h;
  }
  EXPECT_EQ(F16ToF32(F32ToF16(1e6f)), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F32ToF16(1e-9f), 0);
  EXPECT_EQ(F16ToF32(F32ToF16(0.1f)), 0.0999755859375f);
}

}  // namespace
}  // namespace rl::model_io
