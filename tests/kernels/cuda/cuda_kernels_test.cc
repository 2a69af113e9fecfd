// Every CUDA op against the CPU kernel (the oracle) through the Backend interface, each with a
// declared tolerance, plus the batch invariance of the invariant GEMM and of attention.
// Label gpu: skipped when no CUDA device is visible (or the build has no CUDA).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/model_io/dtype.h"
#include "gtest/gtest.h"
#include "services/worker/model/backend.h"
#include "services/worker/model/cuda_runner.h"
#include "tests/testing/numeric.h"

namespace rl::model {
namespace {

using model_io::DType;
using ::rl::testing::MaxAbsDiff;
using ::rl::testing::Random;

std::vector<uint8_t> Store(const std::vector<float>& f, DType dtype) {
  std::vector<uint8_t> raw(f.size() * model_io::DTypeSize(dtype));
  model_io::ConvertFromF32(f.data(), static_cast<int64_t>(f.size()), dtype, raw.data());
  return raw;
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (NumCudaDevices() == 0) GTEST_SKIP() << "no CUDA device visible";
    cpu_ = CreateCpuBackend(2);
    auto g = CreateCudaBackend({});
    ASSERT_TRUE(g.ok()) << g.status();
    gpu_ = std::move(*g);
    CudaBackendOptions inv;
    inv.batch_invariant = true;
    auto gi = CreateCudaBackend(inv);
    ASSERT_TRUE(gi.ok()) << gi.status();
    gpu_inv_ = std::move(*gi);
  }

  // A device copy of host bytes, kept alive by the fixture.
  template <typename T>
  T* Up(Backend* b, const std::vector<T>& host) {
    auto buf = b->Allocate(static_cast<int64_t>(host.size() * sizeof(T)));
    EXPECT_TRUE(buf.ok()) << buf.status();
    EXPECT_TRUE(
        b->CopyToDevice(buf->data(), host.data(), static_cast<int64_t>(host.size() * sizeof(T)))
            .ok());
    buffers_.push_back(std::move(*buf));
    return static_cast<T*>(buffers_.back().data());
  }
  float* Zeros(Backend* b, size_t n) { return Up(b, std::vector<float>(n, 0.0f)); }
  std::vector<float> Down(Backend* b, const float* d, size_t n) {
    std::vector<float> h(n);
    absl::Status s = b->CopyToHost(h.data(), d, static_cast<int64_t>(n * sizeof(float)));
    EXPECT_TRUE(s.ok()) << s;
    return h;
  }

  std::unique_ptr<Backend> cpu_, gpu_, gpu_inv_;
  std::vector<DeviceBuffer> buffers_;
};

TEST_F(CudaKernelsTest, Embedding) {
  const int64_t rows = 300, dim = 96;
  const std::vector<float> table = Random(rows * dim, 1);
  const std::vector<int32_t> ids = {0, 5, 299, 5, 17};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::vector<uint8_t> raw = Store(table, dt);
    std::vector<float> out[2];
    Backend* backends[2] = {cpu_.get(), gpu_.get()};
    for (int i = 0; i < 2; ++i) {
      Backend* b = backends[i];
      kernels::EmbeddingParams p;
      p.table = i == 0 ? static_cast<const void*>(raw.data()) : Up(b, raw);
      p.table_dtype = dt;
      p.ids = i == 0 ? ids.data() : Up(b, ids);
      p.num_tokens = static_cast<int64_t>(ids.size());
      p.num_rows = rows;
      p.dim = dim;
      p.out =
          i == 0 ? (out[0].resize(ids.size() * dim), out[0].data()) : Zeros(b, ids.size() * dim);
      ASSERT_TRUE(b->Embedding(p).ok());
      if (i == 1) out[1] = Down(b, p.out, ids.size() * dim);
    }
    EXPECT_EQ(MaxAbsDiff(out[0], out[1]), 0.0f) << model_io::DTypeName(dt);  // exact widening
  }
}

TEST_F(CudaKernelsTest, RmsNormAndFusedAdd) {
  const int64_t rows = 7, dim = 1000;
  const std::vector<float> x = Random(rows * dim, 2);
  const std::vector<float> delta = Random(rows * dim, 3);
  const std::vector<float> w = Random(dim, 4);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::vector<uint8_t> wr = Store(w, dt);
    for (bool fused : {false, true}) {
      // CPU
      std::vector<float> cx = x, cy(rows * dim);
      kernels::RmsNormParams p;
      p.x = cx.data();
      p.w = wr.data();
      p.w_dtype = dt;
      p.y = cy.data();
      p.rows = rows;
      p.dim = dim;
      p.eps = 1e-5f;
      ASSERT_TRUE(fused ? cpu_->AddRmsNorm(delta.data(), p).ok() : cpu_->RmsNorm(p).ok());
      // GPU, with y aliasing delta as the transformer does
      float* gx = Up(gpu_.get(), x);
      float* gd = Up(gpu_.get(), delta);
      kernels::RmsNormParams g = p;
      g.x = gx;
      g.w = Up(gpu_.get(), wr);
      g.y = fused ? gd : Zeros(gpu_.get(), rows * dim);
      ASSERT_TRUE(fused ? gpu_->AddRmsNorm(gd, g).ok() : gpu_->RmsNorm(g).ok());
      EXPECT_LE(MaxAbsDiff(cy, Down(gpu_.get(), g.y, rows * dim)), 1e-5f) << fused;
      EXPECT_LE(MaxAbsDiff(cx, Down(gpu_.get(), gx, rows * dim)), 0.0f) << "residual";
    }
  }
}

TEST_F(CudaKernelsTest, Rope) {
  const int64_t tokens = 5, heads = 4, kv_heads = 2, hd = 64, half = hd / 2;
  const std::vector<float> q = Random(tokens * heads * hd, 5);
  const std::vector<float> k = Random(tokens * kv_heads * hd, 6);
  std::vector<float> cos(tokens * half), sin(tokens * half);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = (t + 3) * std::pow(10000.0, -2.0 * i / hd);
      cos[t * half + i] = static_cast<float>(std::cos(a));
      sin[t * half + i] = static_cast<float>(std::sin(a));
    }
  }
  std::vector<float> cq = q, ck = k;
  kernels::RopeParams p;
  p.q = cq.data();
  p.k = ck.data();
  p.cos = cos.data();
  p.sin = sin.data();
  p.num_tokens = tokens;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = hd;
  p.q_stride = heads * hd;
  p.k_stride = kv_heads * hd;
  ASSERT_TRUE(cpu_->Rope(p).ok());
  kernels::RopeParams g = p;
  g.q = Up(gpu_.get(), q);
  g.k = Up(gpu_.get(), k);
  g.cos = Up(gpu_.get(), cos);
  g.sin = Up(gpu_.get(), sin);
  ASSERT_TRUE(gpu_->Rope(g).ok());
  EXPECT_LE(MaxAbsDiff(cq, Down(gpu_.get(), g.q, q.size())), 1e-6f);
  EXPECT_LE(MaxAbsDiff(ck, Down(gpu_.get(), g.k, k.size())), 1e-6f);
}

TEST_F(CudaKernelsTest, SiluMulAddGather) {
  const std::vector<float> gate = Random(5000, 7), up = Random(5000, 8);
  std::vector<float> out(5000);
  kernels::SiluMulParams p{gate.data(), up.data(), out.data(), 5000};
  ASSERT_TRUE(cpu_->SiluMul(p).ok());
  kernels::SiluMulParams g{Up(gpu_.get(), gate), Up(gpu_.get(), up), Zeros(gpu_.get(), 5000), 5000};
  ASSERT_TRUE(gpu_->SiluMul(g).ok());
  EXPECT_LE(MaxAbsDiff(out, Down(gpu_.get(), g.out, 5000)), 1e-5f);

  std::vector<float> y = up;
  ASSERT_TRUE(cpu_->AddInPlace(gate.data(), y.data(), 5000).ok());
  float* gy = Up(gpu_.get(), up);
  ASSERT_TRUE(gpu_->AddInPlace(g.gate, gy, 5000).ok());
  EXPECT_EQ(MaxAbsDiff(y, Down(gpu_.get(), gy, 5000)), 0.0f);

  const std::vector<int32_t> rows = {3, 0, 3, 9};
  std::vector<float> gathered(4 * 500);
  ASSERT_TRUE(cpu_->GatherRows(gate.data(), rows.data(), 4, 500, gathered.data()).ok());
  float* go = Zeros(gpu_.get(), 4 * 500);
  ASSERT_TRUE(gpu_->GatherRows(g.gate, Up(gpu_.get(), rows), 4, 500, go).ok());
  EXPECT_EQ(MaxAbsDiff(gathered, Down(gpu_.get(), go, 4 * 500)), 0.0f);
}

struct MatmulCase {
  DType w_dtype;
  bool bias;
  int64_t m, n, k;
};

TEST_F(CudaKernelsTest, MatmulCublasAndInvariantAgainstCpu) {
  for (const MatmulCase& c :
       {MatmulCase{DType::kF32, false, 1, 257, 130}, MatmulCase{DType::kF32, true, 33, 64, 512},
        MatmulCase{DType::kBF16, false, 5, 300, 256}, MatmulCase{DType::kBF16, true, 70, 129, 200},
        MatmulCase{DType::kF16, true, 3, 96, 64}}) {
    const std::vector<float> x = Random(c.m * c.k, 9, 0.5f);
    const std::vector<uint8_t> w = Store(Random(c.n * c.k, 10, 0.1f), c.w_dtype);
    const std::vector<uint8_t> bias = Store(Random(c.n, 11), c.w_dtype);
    std::vector<float> ref(c.m * c.n);
    kernels::MatmulParams p;
    p.x = x.data();
    p.w = w.data();
    p.w_dtype = c.w_dtype;
    p.bias = c.bias ? bias.data() : nullptr;
    p.bias_dtype = c.w_dtype;
    p.y = ref.data();
    p.m = c.m;
    p.n = c.n;
    p.k = c.k;
    ASSERT_TRUE(cpu_->Matmul(p).ok());
    // cuBLAS rounds the activations to the 16-bit weight dtype: tolerance scales with that.
    const float tol = c.w_dtype == DType::kF32 ? 1e-4f : 2e-2f;
    for (Backend* b : {gpu_.get(), gpu_inv_.get()}) {
      kernels::MatmulParams g = p;
      g.x = Up(b, x);
      g.w = Up(b, w);
      g.bias = c.bias ? Up(b, bias) : nullptr;
      g.y = Zeros(b, c.m * c.n);
      ASSERT_TRUE(b->Matmul(g).ok());
      // The invariant kernel keeps float32 activations: as tight as the CPU for any dtype.
      EXPECT_LE(MaxAbsDiff(ref, Down(b, g.y, c.m * c.n)), b == gpu_inv_.get() ? 1e-4f : tol)
          << model_io::DTypeName(c.w_dtype) << " m=" << c.m
          << (b == gpu_.get() ? " cublas" : " invariant");
    }
  }
}

TEST_F(CudaKernelsTest, InvariantMatmulRowDoesNotDependOnBatch) {
  const int64_t n = 200, k = 333;
  const std::vector<uint8_t> w = Store(Random(n * k, 12, 0.1f), DType::kBF16);
  const std::vector<float> row = Random(k, 13);
  const void* gw = Up(gpu_inv_.get(), w);
  std::vector<float> alone;
  for (int64_t m : {1, 2, 17, 64, 65, 200}) {
    std::vector<float> x = Random(m * k, 14 + static_cast<uint32_t>(m));
    const int64_t at = m / 2;  // the row sits mid-batch
    std::copy(row.begin(), row.end(), x.begin() + at * k);
    kernels::MatmulParams g;
    g.x = Up(gpu_inv_.get(), x);
    g.w = gw;
    g.w_dtype = DType::kBF16;
    g.y = Zeros(gpu_inv_.get(), m * n);
    g.m = m;
    g.n = n;
    g.k = k;
    ASSERT_TRUE(gpu_inv_->Matmul(g).ok());
    std::vector<float> y = Down(gpu_inv_.get(), g.y, m * n);
    std::vector<float> mine(y.begin() + at * n, y.begin() + (at + 1) * n);
    if (alone.empty()) {
      alone = mine;
    } else {
      EXPECT_EQ(std::memcmp(alone.data(), mine.data(), n * sizeof(float)), 0) << "m=" << m;
    }
  }
}

// A mixed batch: sequence A decodes one token at position 699 (three splits), sequence B
// prefills a 40-token chunk after a 260-token cached prefix (positions cross a split border),
// sequence C decodes at position 0. Slots are shuffled. GQA 8 query heads over 2 KV heads.
class CudaAttentionTest : public CudaKernelsTest, public ::testing::WithParamInterface<DType> {
 protected:
  void SetUp() override { CudaKernelsTest::SetUp(); }
};

// Values already representable in `dtype`, so a cache stored in it holds them exactly and the
// CPU (float32) is a reference up to summation order.
std::vector<float> Representable(std::vector<float> v, DType dtype) {
  const std::vector<uint8_t> raw = Store(v, dtype);
  model_io::ConvertToF32(dtype, raw.data(), static_cast<int64_t>(v.size()), v.data());
  return v;
}

// With `dtype` = BF16 the device cache is bf16 (written from float32, read widened).
TEST_P(CudaAttentionTest, PagedAttentionMixedBatch) {
  const DType kv_dtype = GetParam();
  const int64_t heads = 8, kv_heads = 2, hd = 64, kv_dim = kv_heads * hd, num_slots = 1200;
  std::mt19937 rng(15);
  std::vector<int32_t> perm(num_slots);
  for (int32_t i = 0; i < num_slots; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::vector<int32_t> seq_len = {700, 300, 1};  // positions in each sequence's context
  const std::vector<int32_t> new_tokens = {1, 40, 1};
  std::vector<int32_t> slots, context_len, slot_begin, write_slots;
  int32_t next = 0;
  for (size_t s = 0; s < seq_len.size(); ++s) {
    const int32_t begin = static_cast<int32_t>(slots.size());
    for (int32_t j = 0; j < seq_len[s]; ++j) slots.push_back(perm[next++]);
    for (int32_t i = 0; i < new_tokens[s]; ++i) {
      const int32_t pos = seq_len[s] - new_tokens[s] + i;
      context_len.push_back(pos + 1);
      slot_begin.push_back(begin);
      write_slots.push_back(slots[begin + pos]);
    }
  }
  const int64_t tokens = static_cast<int64_t>(context_len.size());
  const std::vector<float> k_cache = Representable(Random(num_slots * kv_dim, 16), kv_dtype);
  const std::vector<float> v_cache = Representable(Random(num_slots * kv_dim, 17), kv_dtype);
  const std::vector<float> q = Random(tokens * heads * hd, 18);
  const std::vector<float> k_new = Representable(Random(tokens * kv_dim, 19), kv_dtype);
  const std::vector<float> v_new = Representable(Random(tokens * kv_dim, 20), kv_dtype);

  std::vector<float> ck = k_cache, cv = v_cache, cout(tokens * heads * hd);
  std::vector<float> ws(2 * 1024);
  kernels::WriteKvParams wk;
  wk.k = k_new.data();
  wk.v = v_new.data();
  wk.slots = write_slots.data();
  wk.k_cache = ck.data();
  wk.v_cache = cv.data();
  wk.num_tokens = tokens;
  wk.kv_dim = kv_dim;
  wk.k_stride = kv_dim;
  wk.v_stride = kv_dim;
  wk.num_slots = num_slots;
  ASSERT_TRUE(cpu_->WriteKv(wk).ok());
  kernels::AttentionParams at;
  at.q = q.data();
  at.k_cache = ck.data();
  at.v_cache = cv.data();
  at.out = cout.data();
  at.context_len = context_len.data();
  at.slot_begin = slot_begin.data();
  at.slots = slots.data();
  at.workspace = ws.data();
  at.num_workspaces = 2;
  at.num_tokens = tokens;
  at.num_heads = heads;
  at.num_kv_heads = kv_heads;
  at.head_dim = hd;
  at.q_stride = heads * hd;
  at.num_slots = num_slots;
  at.num_slot_entries = static_cast<int64_t>(slots.size());
  at.max_context = 1024;
  at.scale = 1.0f / 8.0f;
  ASSERT_TRUE(cpu_->Attention(at).ok());

  Backend* g = gpu_.get();
  kernels::WriteKvParams gwk = wk;
  gwk.k = Up(g, k_new);
  gwk.v = Up(g, v_new);
  gwk.slots = Up(g, write_slots);
  gwk.k_cache = Up(g, Store(k_cache, kv_dtype));
  gwk.v_cache = Up(g, Store(v_cache, kv_dtype));
  gwk.kv_dtype = kv_dtype;
  ASSERT_TRUE(g->WriteKv(gwk).ok());
  {
    std::vector<uint8_t> raw(ck.size() * model_io::DTypeSize(kv_dtype));
    ASSERT_TRUE(g->CopyToHost(raw.data(), gwk.k_cache, static_cast<int64_t>(raw.size())).ok());
    std::vector<float> written(ck.size());
    model_io::ConvertToF32(kv_dtype, raw.data(), static_cast<int64_t>(ck.size()), written.data());
    EXPECT_EQ(MaxAbsDiff(ck, written), 0.0f);
  }
  kernels::AttentionParams gat = at;
  gat.q = Up(g, q);
  gat.k_cache = gwk.k_cache;
  gat.v_cache = gwk.v_cache;
  gat.kv_dtype = kv_dtype;
  gat.out = Zeros(g, cout.size());
  gat.context_len = Up(g, context_len);
  gat.slot_begin = Up(g, slot_begin);
  gat.slots = Up(g, slots);
  gat.workspace = nullptr;  // the device backend owns its workspace
  gat.batch_max_context = 700;
  ASSERT_TRUE(g->Attention(gat).ok());
  const std::vector<float> gout = Down(g, gat.out, cout.size());
  EXPECT_LE(MaxAbsDiff(cout, gout), 2e-5f);

  // Invariance: the decode token of A alone gives the same bits as inside the batch.
  kernels::AttentionParams one = gat;
  one.num_tokens = 1;
  one.batch_max_context = 700;
  one.out = Zeros(g, heads * hd);
  ASSERT_TRUE(g->Attention(one).ok());
  const std::vector<float> alone = Down(g, one.out, heads * hd);
  EXPECT_EQ(std::memcmp(alone.data(), gout.data(), heads * hd * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, CudaAttentionTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return model_io::DTypeName(info.param); });

TEST_F(CudaKernelsTest, BadShapesAreInvalidArgument) {
  kernels::MatmulParams p;  // null pointers
  EXPECT_EQ(gpu_->Matmul(p).code(), absl::StatusCode::kInvalidArgument);
  kernels::AttentionParams a;
  EXPECT_EQ(gpu_->Attention(a).code(), absl::StatusCode::kInvalidArgument);
  kernels::EmbeddingParams e;
  EXPECT_EQ(gpu_->Embedding(e).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->Allocate(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rl::model
