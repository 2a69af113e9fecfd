// The backend-neutral op params (kernels/<op>.h) and their checks, linked without any kernel
// library: what every backend validates before it runs an op.
#include <cstdint>
#include <vector>

#include "common/model_io/dtype.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"

namespace rl::kernels {
namespace {

using model_io::DType;

TEST(ParamsTest, AttentionShapesNeedNoHostBuffersAndAnyKvDtype) {
  // ValidateShapes reads no buffer: any non-null pointer passes (device memory).
  float dummy = 0;
  const int32_t ids[1] = {0};
  AttentionParams p;
  p.q = &dummy;
  p.k_cache = &dummy;
  p.v_cache = &dummy;
  p.out = &dummy;
  p.context_len = ids;
  p.slot_begin = ids;
  p.slots = ids;
  p.num_heads = 4;
  p.num_kv_heads = 3;
  p.head_dim = 8;
  p.q_stride = 32;
  p.num_slots = 1;
  p.max_context = 1;
  EXPECT_EQ(p.ValidateShapes().message(), "attention: bad sizes heads=4 kv_heads=3 head_dim=8");
  p.num_kv_heads = 2;
  p.kv_dtype = DType::kBF16;  // a device KV cache; no workspace (device backends own theirs)
  EXPECT_TRUE(p.ValidateShapes().ok());
  p.num_tokens = 1;
  p.num_slot_entries = 1;
  EXPECT_EQ(p.Validate().message(), "attention: token 0 context 0 at slot entry 0 out of range");
  const int32_t one[1] = {1};
  p.context_len = one;
  EXPECT_TRUE(p.Validate().ok());
  p.q = nullptr;
  EXPECT_EQ(p.ValidateShapes().message(), "attention: null buffer");
}

TEST(ParamsTest, WriteKvChecksSlotsNotDtype) {
  std::vector<float> k(4), v(4);
  std::vector<uint16_t> kc(8), vc(8);
  std::vector<int32_t> slots = {3, 1};
  WriteKvParams p{k.data(), v.data(), slots.data(), kc.data(), vc.data(), 2, 2, 2,
                  2,        4,        DType::kBF16};
  EXPECT_TRUE(p.Validate().ok());
  slots[1] = -1;
  EXPECT_TRUE(p.ValidateShapes().ok());
  EXPECT_EQ(p.Validate().message(), "write_kv: slot -1 out of range [0, 4)");
  p.k_stride = 1;
  EXPECT_EQ(p.ValidateShapes().message(), "write_kv: bad sizes");
}

TEST(ParamsTest, EmbeddingMatmulNormRopeSiluMoe) {
  float f = 0;
  const int32_t bad_id[1] = {7};
  EmbeddingParams e{&f, DType::kF16, bad_id, &f, 1, 7, 4};
  EXPECT_TRUE(e.ValidateShapes().ok());
  EXPECT_EQ(e.Validate().message(), "embedding: token id 7 out of range [0, 7)");
  e.table_dtype = DType::kI64;
  EXPECT_EQ(e.ValidateShapes().message(), "embedding: bad sizes or dtype");

  MatmulParams a{&f, &f, DType::kBF16, nullptr, DType::kF32, &f, 2, 3, 4};
  EXPECT_TRUE(a.Validate().ok());
  MatmulParams b = a;
  b.m = 1;
  const MatmulParams group[] = {a, b};
  EXPECT_EQ(ValidateMatmulGroup(group).message(), "matmul group: m=1 differs from the first's m=2");
  EXPECT_EQ(ValidateMatmulGroup({}).message(), "matmul group: empty");
  a.w_dtype = DType::kI8;
  EXPECT_EQ(a.Validate().message(), "matmul: weights must be F32, BF16 or F16");

  RmsNormParams n{&f, &f, DType::kF32, &f, 1, 0, 1e-6f};
  EXPECT_EQ(n.Validate().message(), "rmsnorm: bad rows=1 dim=0");

  RopeParams r{&f, &f, &f, &f, 1, 2, 1, 7, 14, 7};
  EXPECT_EQ(r.Validate().message(), "rope: bad sizes heads=2 kv_heads=1 head_dim=7");

  SiluMulParams s{&f, &f, &f, -1};
  EXPECT_EQ(s.Validate().message(), "silu_mul: null buffer or negative size");

  int32_t ids[2] = {0, 0};
  MoeRouteParams route{&f, ids, &f, 1, 2, 3, true};
  EXPECT_EQ(route.Validate().message(), "moe_route: bad sizes tokens=1 experts=2 top_k=3");
  const void* experts[2] = {&f, nullptr};
  float y = 0;
  MoeExpertsParams ex{&f, ids, &f, experts, experts, experts, DType::kBF16, &y, 1, 4, 8, 2, 1};
  EXPECT_EQ(ex.Validate().message(), "moe_experts: expert 1 has no weights");
  ex.y = &f;
  EXPECT_EQ(ex.Validate().message(), "moe_experts: y must not alias x");
}

}  // namespace
}  // namespace rl::kernels
