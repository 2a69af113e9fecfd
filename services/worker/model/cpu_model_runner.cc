#include "services/worker/model/cpu_model_runner.h"

#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/cpu_info.h"
#include "services/worker/model/cpu_backend.h"
#include "spdlog/spdlog.h"

namespace rl::model {

absl::StatusOr<std::unique_ptr<CpuModelRunner>> CpuModelRunner::Create(
    const RunnerOptions& options) {
  if (options.page_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be positive, got ", options.page_size));
  }
  if (options.kv_cache_dtype != "auto" && options.kv_cache_dtype != "float32") {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache_dtype '", options.kv_cache_dtype, "': the CPU KV cache is float32"));
  }
  auto r = std::unique_ptr<CpuModelRunner>(new CpuModelRunner());
  ASSIGN_OR_RETURN(r->config_, model_io::LoadModelConfig(options.model_dir));
  r->page_size_ = options.page_size;
  r->huge_pages_enabled_ = options.cpu_huge_pages;
  ASSIGN_OR_RETURN(r->weights_, LoadWeights(options.model_dir, r->config_));
  if (options.reserve_update_buffers) r->weights_->ReserveUpdateBuffers();
  int64_t slots = options.num_kv_slots;
  if (slots <= 0) slots = options.kv_cache_bytes / Transformer::KvBytesPerSlot(r->config_);
  slots = slots / options.page_size * options.page_size;
  if (slots <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache budget holds no page: ", options.kv_cache_bytes, " bytes at ",
        Transformer::KvBytesPerSlot(r->config_), " bytes per slot, page_size ", options.page_size));
  }
  if (options.cpu_op_profile) r->op_profile_ = std::make_unique<kernels::cpu::OpProfile>();
  CpuBackendOptions backend_options;
  backend_options.num_threads = options.num_threads;
  backend_options.bf16_products = options.cpu_bf16_products;
  backend_options.huge_page_kv_cache = options.cpu_huge_pages;
  backend_options.profile = r->op_profile_.get();
  ASSIGN_OR_RETURN(r->backend_, CreateCpuBackend(backend_options));
  static std::once_flag logged;  // the CPU and the plan are the process's: one line
  std::call_once(logged, [] {
    spdlog::info("cpu kernels: {}; {}", kernels::cpu::GetCpuInfo().Describe(),
                 kernels::cpu::GetKernelPlan().Describe());
  });
  ASSIGN_OR_RETURN(r->transformer_, Transformer::Create(r->config_, r->backend_.get(), slots));
  r->CollapseServedWeights();
  return r;
}

void CpuModelRunner::CollapseServedWeights() {
  if (!huge_pages_enabled_) return;
  std::vector<absl::Span<const uint8_t>> ranges;
  weights_->Visit(
      [&](const TensorInfo&, absl::Span<const uint8_t> bytes) { ranges.push_back(bytes); });
  huge_pages_.Collapse(ranges);
}

absl::Status CpuModelRunner::Forward(const ForwardInput& in, ForwardOutput* out) {
  if (out == nullptr) return absl::InvalidArgumentError("Forward: null output");
  return transformer_->Forward(*weights_, in, out);
}

absl::Status CpuModelRunner::VisitWeights(
    const std::function<void(const TensorInfo&, absl::Span<const uint8_t>)>& fn) const {
  weights_->Visit(fn);
  return absl::OkStatus();
}

absl::Status CpuModelRunner::LoadWeightsFromDisk(const std::string& model_dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<Weights> fresh, LoadWeights(model_dir, config_));
  return SwapWeights(std::move(fresh));
}

absl::Status CpuModelRunner::UpdateWeight(const TensorInfo& info, absl::Span<const uint8_t> bytes) {
  return weights_->Update(info, bytes);
}

absl::Status CpuModelRunner::ActivateWeights(std::unique_ptr<Weights>* weights,
                                             const std::string& source, const std::string&) {
  if (weights == nullptr || *weights == nullptr) {
    return absl::InvalidArgumentError("ActivateWeights: no weights");
  }
  if (absl::Status s = CheckSameArchitecture(config_, (*weights)->config()); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ActivateWeights (", source, "): ", s.message()));
  }
  // A pointer swap: the weights served before go back to the caller, who frees them after the
  // pause (freeing a model's pages here would hold the engine thread for milliseconds per GB).
  std::swap(weights_, *weights);
  CollapseServedWeights();
  return absl::OkStatus();
}

absl::Status CpuModelRunner::SwapWeights(std::unique_ptr<Weights> weights) {
  if (weights == nullptr) return absl::InvalidArgumentError("SwapWeights: null weights");
  if (absl::Status s = CheckSameArchitecture(config_, weights->config()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("SwapWeights: ", s.message()));
  }
  // The old weights are freed at the return, after the collapser moved on to the new ones
  // (never MADV_COLLAPSE memory while it is being unmapped or handed to the spare pool).
  std::swap(weights_, weights);
  CollapseServedWeights();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuModelRunner(const RunnerOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CpuModelRunner> r, CpuModelRunner::Create(options));
  return std::unique_ptr<ModelRunner>(std::move(r));
}

}  // namespace rl::model
