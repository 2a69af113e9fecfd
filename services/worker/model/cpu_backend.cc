#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/silu_mul.h"
#include "kernels/cpu/thread_pool.h"
#include "services/worker/model/backend.h"

namespace rl::model {

namespace {

namespace kc = kernels::cpu;

class CpuBackend final : public Backend {
 public:
  CpuBackend(int num_threads, bool bf16_products)
      : pool_(num_threads), bf16_products_(bf16_products) {}

  std::string name() const override { return "cpu"; }
  int num_threads() const override { return pool_.num_threads(); }

  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("allocate: negative size");
    const size_t size = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, size);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    }
    return DeviceBuffer(p, bytes, [](void* q) { std::free(q); });
  }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

  absl::Status Embedding(const kernels::EmbeddingParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    kc::Embedding(p, &pool_);
    return absl::OkStatus();
  }
  absl::Status RmsNorm(const kernels::RmsNormParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    kc::RmsNorm(p, &pool_);
    return absl::OkStatus();
  }
  absl::Status Matmul(const kernels::MatmulParams& p) override {
    return MatmulGroup(absl::MakeConstSpan(&p, 1));
  }
  absl::Status MatmulGroup(absl::Span<const kernels::MatmulParams> group) override {
    // bf16-products mode applies to BF16 weights; other matmuls (a float32 LM head or router)
    // keep float32 activations.
    const bool bf16 = bf16_products_ &&
                      std::all_of(group.begin(), group.end(), [](const kernels::MatmulParams& p) {
                        return p.w_dtype == model_io::DType::kBF16;
                      });
    if (bf16) {
      RETURN_IF_ERROR(kc::ValidateMatmulGroupBf16Products(group));
      kc::MatmulGroupBf16Products(group, &pool_);
    } else {
      RETURN_IF_ERROR(kernels::ValidateMatmulGroup(group));
      kc::MatmulGroup(group, &pool_);
    }
    return absl::OkStatus();
  }
  absl::Status Rope(const kernels::RopeParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    kc::Rope(p, &pool_);
    return absl::OkStatus();
  }
  absl::Status WriteKv(const kernels::WriteKvParams& p) override {
    RETURN_IF_ERROR(kc::ValidateWriteKv(p));
    kc::WriteKv(p);
    return absl::OkStatus();
  }
  absl::Status Attention(const kernels::AttentionParams& p) override {
    RETURN_IF_ERROR(kc::ValidateAttention(p));
    if (p.num_workspaces < pool_.num_threads()) {
      return absl::InvalidArgumentError("attention: fewer workspaces than threads");
    }
    kc::Attention(p, &pool_);
    return absl::OkStatus();
  }
  absl::Status SiluMul(const kernels::SiluMulParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    kc::SiluMul(p, &pool_);
    return absl::OkStatus();
  }
  absl::Status MoeRoute(const kernels::MoeRouteParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    kc::MoeRoute(p);
    return absl::OkStatus();
  }
  absl::Status MoeExperts(const kernels::MoeExpertsParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    return kc::MoeExperts(p, &pool_, &moe_scratch_);
  }
  absl::Status AddInPlace(const float* x, float* y, int64_t n) override {
    if (x == nullptr || y == nullptr || n < 0) return absl::InvalidArgumentError("add: bad args");
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
    return absl::OkStatus();
  }
  absl::Status GatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim,
                          float* out) override {
    if (x == nullptr || rows == nullptr || out == nullptr || num_rows < 0 || dim <= 0) {
      return absl::InvalidArgumentError("gather_rows: bad args");
    }
    for (int64_t r = 0; r < num_rows; ++r) {
      std::memmove(out + r * dim, x + static_cast<int64_t>(rows[r]) * dim, dim * sizeof(float));
    }
    return absl::OkStatus();
  }

 private:
  kc::ThreadPool pool_;
  const bool bf16_products_;
  kc::MoeScratch moe_scratch_;
};

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(int num_threads) {
  return CreateCpuBackend(num_threads, /*bf16_products=*/false).value();
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(int num_threads, bool bf16_products) {
  if (bf16_products && !kc::Bf16ProductsSupported()) {
    return absl::FailedPreconditionError(
        "bf16 products (--cpu-bf16-products) need a CPU with AVX512-BF16; this one has none");
  }
  if (num_threads <= 0) {
    num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  return std::make_unique<CpuBackend>(num_threads, bf16_products);
}

}  // namespace rl::model
