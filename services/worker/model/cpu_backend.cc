#include "services/worker/model/cpu_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
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

using kernels::cpu::OpProfile;

// "a+b+c" of the matmuls' n.
std::string JoinN(absl::Span<const kernels::MatmulParams> group) {
  std::string out;
  for (const kernels::MatmulParams& p : group) absl::StrAppend(&out, out.empty() ? "" : "+", p.n);
  return out;
}

// Buffers of at least this size (the KV cache, a long prefill's activations) get their pages
// committed when allocated rather than on first touch: a decode step writes one new KV slot per
// sequence and layer, a page fault each time on a fresh cache (2-3% of a decode step, measured),
// where llama.cpp clears its cache up front.
constexpr size_t kPopulateBytes = size_t{64} << 10;
constexpr size_t kHugePage = size_t{2} << 20;

// Commits the whole pages of [p, p + size) (MADV_POPULATE_WRITE; on kernels before 5.14, one
// write per page).
void Populate(void* p, size_t size) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + size) / page * page;
  if (end <= begin) return;
#ifdef MADV_POPULATE_WRITE
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0) return;
#endif
  for (uintptr_t a = begin; a < end; a += page) *reinterpret_cast<volatile char*>(a) = 0;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int num_threads, bool bf16_products, bool huge_page_kv_cache, OpProfile* profile,
             const kc::KernelPlan& plan)
      : pool_(num_threads),
        bf16_products_(bf16_products),
        huge_page_kv_cache_(huge_page_kv_cache),
        profile_(profile),
        plan_(plan) {
    pool_.set_collect_stats(profile != nullptr);
  }

  std::string name() const override { return "cpu"; }
  int num_threads() const override { return pool_.num_threads(); }

  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("allocate: negative size");
    const size_t size = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, size);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    }
    if (size >= kPopulateBytes) Populate(p, size);
    return DeviceBuffer(p, bytes, [](void* q) { std::free(q); });
  }
  // With huge_page_kv_cache: at a 2 MiB boundary, whole 2 MiB pages, MADV_HUGEPAGE, then
  // committed (the faults take 2 MiB pages, compacting memory first where none is free: once, at
  // start-up, never on a serving path; on the Zen 5 VM of the README a worker with a 2 GiB cache
  // starts in 3.2-3.6 s instead of 1.0 s, with 256 MiB no slower). Where the kernel has no
  // transparent huge pages the advice is refused or ignored and the cache stays in 4 KiB pages.
  absl::StatusOr<DeviceBuffer> AllocateKvCache(int64_t bytes) override {
    if (!huge_page_kv_cache_ || bytes < kHugePage) return Allocate(bytes);
    const size_t size = (static_cast<size_t>(bytes) + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(kHugePage, size);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    }
    (void)madvise(p, size, MADV_HUGEPAGE);
    Populate(p, size);
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
  absl::Status CopyOnDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

  absl::Status Embedding(const kernels::EmbeddingParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    Profiled(
        "embedding", [&] { kc::Embedding(p, &pool_); },
        [&](OpProfile::Row*) { return absl::StrCat("tokens=", p.num_tokens); });
    return absl::OkStatus();
  }
  absl::Status RmsNorm(const kernels::RmsNormParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    Profiled(
        "rmsnorm", [&] { kc::RmsNorm(p, &pool_); },
        [&](OpProfile::Row*) { return absl::StrCat("rows=", p.rows, " dim=", p.dim); });
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
    } else {
      RETURN_IF_ERROR(kernels::ValidateMatmulGroup(group));
    }
    Profiled(
        "matmul",
        [&] {
          if (bf16) {
            kc::MatmulGroupBf16Products(group, &pool_, plan_);
          } else {
            kc::MatmulGroup(group, &pool_, plan_);
          }
        },
        [&](OpProfile::Row* row) {
          for (const kernels::MatmulParams& p : group) {
            row->flops += 2.0 * static_cast<double>(p.m * p.n * p.k);
            row->weight_bytes += static_cast<double>(p.n * p.k * model_io::DTypeSize(p.w_dtype));
          }
          return absl::StrCat("m=", group[0].m, " n=", JoinN(group), " k=", group[0].k,
                              bf16 ? " bf16" : "");
        });
    return absl::OkStatus();
  }
  absl::Status Rope(const kernels::RopeParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    Profiled(
        "rope", [&] { kc::Rope(p, &pool_); },
        [&](OpProfile::Row*) { return absl::StrCat("tokens=", p.num_tokens); });
    return absl::OkStatus();
  }
  absl::Status WriteKv(const kernels::WriteKvParams& p) override {
    RETURN_IF_ERROR(kc::ValidateWriteKv(p));
    Profiled(
        "write_kv", [&] { kc::WriteKv(p); },
        [&](OpProfile::Row*) { return absl::StrCat("tokens=", p.num_tokens); });
    return absl::OkStatus();
  }
  absl::Status Attention(const kernels::AttentionParams& p) override {
    RETURN_IF_ERROR(kc::ValidateAttention(p));
    if (p.num_workspaces < pool_.num_threads()) {
      return absl::InvalidArgumentError("attention: fewer workspaces than threads");
    }
    Profiled(
        "attention", [&] { kc::Attention(p, &pool_); },
        [&](OpProfile::Row* row) {
          double positions = 0;
          for (int64_t t = 0; t < p.num_tokens; ++t) positions += p.context_len[t];
          row->flops = 4.0 * positions * static_cast<double>(p.num_heads * p.head_dim);
          return absl::StrCat("tokens=", p.num_tokens);
        });
    return absl::OkStatus();
  }
  absl::Status SiluMul(const kernels::SiluMulParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    Profiled(
        "silu_mul", [&] { kc::SiluMul(p, &pool_); },
        [&](OpProfile::Row*) { return absl::StrCat("n=", p.n); });
    return absl::OkStatus();
  }
  absl::Status MoeRoute(const kernels::MoeRouteParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    kc::MoeRoute(p);
    return absl::OkStatus();
  }
  absl::Status MoeExperts(const kernels::MoeExpertsParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    absl::Status status;
    Profiled(
        "moe", [&] { status = kc::MoeExperts(p, &pool_, &moe_scratch_); },
        [&](OpProfile::Row*) { return absl::StrCat("tokens=", p.num_tokens); });
    return status;
  }
  absl::Status AddRmsNorm(const float* delta, const kernels::RmsNormParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    if (delta == nullptr) return absl::InvalidArgumentError("add_rmsnorm: null delta");
    Profiled(
        "add_norm", [&] { kc::AddRmsNorm(delta, p, &pool_); },
        [&](OpProfile::Row*) { return absl::StrCat("rows=", p.rows, " dim=", p.dim); });
    return absl::OkStatus();
  }
  absl::Status AddInPlace(const float* x, float* y, int64_t n) override {
    if (x == nullptr || y == nullptr || n < 0) return absl::InvalidArgumentError("add: bad args");
    Profiled(
        "add",
        [&] {
          for (int64_t i = 0; i < n; ++i) y[i] += x[i];
        },
        [&](OpProfile::Row*) { return absl::StrCat("n=", n); });
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
  // Runs `run`; with a profile, times it and adds it under the shape `describe(&row)` returns
  // (describe may also set the row's flops and weight bytes).
  template <typename Run, typename Describe>
  void Profiled(const char* op, Run run, Describe describe) {
    if (profile_ == nullptr) {
      run();
      return;
    }
    const kc::ThreadPool::Stats before = pool_.stats();
    const auto t0 = std::chrono::steady_clock::now();
    run();
    OpProfile::Row row;
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    row.sync_seconds = pool_.stats().wait_seconds - before.wait_seconds;
    row.regions = pool_.stats().regions - before.regions;
    std::string shape = describe(&row);
    profile_->Add(op, std::move(shape), row);
  }

  kc::ThreadPool pool_;
  const bool bf16_products_;
  const bool huge_page_kv_cache_;
  OpProfile* const profile_;
  const kc::KernelPlan plan_;
  kc::MoeScratch moe_scratch_;
};

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(int num_threads) {
  return CreateCpuBackend(num_threads, /*bf16_products=*/false).value();
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(int num_threads, bool bf16_products) {
  CpuBackendOptions options;
  options.num_threads = num_threads;
  options.bf16_products = bf16_products;
  return CreateCpuBackend(options);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options) {
  if (options.bf16_products && !kc::Bf16ProductsSupported()) {
    return absl::FailedPreconditionError(
        "bf16 products (--cpu-bf16-products) need a CPU with AVX512-BF16; this one has none");
  }
  int num_threads = options.num_threads;
  if (num_threads <= 0) {
    num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  return std::make_unique<CpuBackend>(num_threads, options.bf16_products,
                                      options.huge_page_kv_cache, options.profile,
                                      kc::GetKernelPlan());
}

}  // namespace rl::model
