// The CUDA model runner over the CUDA Backend (cuda_runner.h has the design).
#include "services/worker/model/cuda_runner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gpu/gpu_status.h"
#include "common/status.h"
#include "services/worker/model/staged_mirror.h"
#include "services/worker/model/transformer.h"
#include "services/worker/model/weights.h"
#include "spdlog/spdlog.h"

namespace rl::model {
namespace {

using model_io::DType;

// The engine keeps per-slot tables on the host: the KV cache never has more slots than this.
constexpr int64_t kMaxKvSlots = int64_t{1} << 22;

class CudaModelRunner final : public ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(const RunnerOptions& o) {
    if (o.page_size <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_size must be positive, got ", o.page_size));
    }
    if (!(o.gpu_memory_fraction > 0 && o.gpu_memory_fraction < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpu_memory_fraction must be in (0, 1), got ", o.gpu_memory_fraction));
    }
    model_io::DType kv_dtype = DType::kBF16;
    if (o.kv_cache_dtype == "float32") {
      kv_dtype = DType::kF32;
    } else if (o.kv_cache_dtype != "auto" && o.kv_cache_dtype != "bfloat16") {
      return absl::InvalidArgumentError(
          absl::StrCat("kv_cache_dtype '", o.kv_cache_dtype, "' is not auto, float32 or bfloat16"));
    }
    std::unique_ptr<CudaModelRunner> r(new CudaModelRunner(o));
    ASSIGN_OR_RETURN(r->config_, model_io::LoadModelConfig(o.model_dir));
    ASSIGN_OR_RETURN(r->host_, LoadWeights(o.model_dir, r->config_));
    if (o.reserve_update_buffers) r->host_->ReserveUpdateBuffers();
    CudaBackendOptions bo;
    bo.device = o.cuda_device;
    bo.batch_invariant = o.batch_invariant;
    ASSIGN_OR_RETURN(r->backend_, CreateCudaBackend(bo));
    ASSIGN_OR_RETURN(r->device_,
                     MirrorWeights(*r->host_, r->backend_.get(), o.fp32_lm_head, o.fp32_router));

    const int64_t per_slot = Transformer::KvBytesPerSlot(r->config_, kv_dtype);
    int64_t slots = o.num_kv_slots;
    if (slots <= 0 && o.kv_cache_bytes > 0) slots = o.kv_cache_bytes / per_slot;
    if (slots <= 0) {
      size_t free_bytes = 0;
      size_t total_bytes = 0;
      RETURN_IF_ERROR(RL_GPU_STATUS(cudaMemGetInfo(&free_bytes, &total_bytes)));
      slots =
          static_cast<int64_t>(static_cast<double>(free_bytes) * o.gpu_memory_fraction) / per_slot;
    }
    // The engine keeps per-slot tables on the host: cap what a small model would otherwise
    // claim (4M tokens is far beyond any running batch).
    slots = std::min<int64_t>(slots, kMaxKvSlots);
    slots = slots / o.page_size * o.page_size;
    if (slots <= 0) {
      return absl::ResourceExhaustedError(absl::StrCat("KV cache budget holds no page at ",
                                                       per_slot, " bytes per slot, page_size ",
                                                       o.page_size));
    }
    r->page_size_ = o.page_size;
    ASSIGN_OR_RETURN(r->transformer_, Transformer::Create(r->config_, r->backend_.get(), slots,
                                                          o.cuda_graphs, kv_dtype));
    absl::StatusOr<std::string> device = DescribeCudaDevice(o.cuda_device);
    spdlog::info(
        "cuda runner on {}: weights {:.2f} GiB, KV cache {} slots of {} ({:.2f} GiB){}{}{}{}",
        device.ok() ? *device : std::string(device.status().message()),
        static_cast<double>(r->host_->TotalBytes()) / (1 << 30), slots,
        model_io::DTypeName(kv_dtype), static_cast<double>(slots * per_slot) / (1 << 30),
        o.batch_invariant ? ", batch-invariant" : "", o.fp32_lm_head ? ", fp32 LM head" : "",
        o.fp32_router && r->config_.IsMoe() ? ", fp32 router" : "",
        o.cuda_graphs ? ", CUDA graphs for decode" : ", no CUDA graphs");
    return r;
  }

  const model_io::ModelConfig& config() const override { return config_; }
  std::string backend_name() const override { return "cuda"; }
  int64_t num_kv_slots() const override { return transformer_->num_kv_slots(); }
  int32_t page_size() const override { return page_size_; }

  absl::Status Forward(const ForwardInput& in, ForwardOutput* out) override {
    if (out == nullptr) return absl::InvalidArgumentError("Forward: null output");
    return transformer_->Forward(*device_, in, out);
  }

  std::vector<TensorInfo> ListWeights() const override { return host_->List(); }
  absl::Status VisitWeights(
      const std::function<void(const TensorInfo&, absl::Span<const uint8_t>)>& fn) const override {
    host_->Visit(fn);
    return absl::OkStatus();
  }
  absl::Status LoadWeightsFromDisk(const std::string& model_dir) override {
    ASSIGN_OR_RETURN(std::unique_ptr<Weights> fresh, LoadWeights(model_dir, config_));
    RETURN_IF_ERROR(CheckSameArchitecture(config_, fresh->config()));
    // Everything is validated on the host; the device copy fails only on a device error.
    RETURN_IF_ERROR(RefreshMirror(*fresh, "", backend_.get(), device_.get()));
    host_ = std::move(fresh);
    return absl::OkStatus();
  }
  // A staged version is held in host memory until here: activation copies it into the device
  // mirror (one host-to-device copy of every tensor inside the pause), then swaps the host copy.
  absl::Status ActivateWeights(std::unique_ptr<Weights>* weights, const std::string& source,
                               const std::string&) override {
    if (weights == nullptr || *weights == nullptr) {
      return absl::InvalidArgumentError("ActivateWeights: no weights");
    }
    RETURN_IF_ERROR(Annotate(CheckSameArchitecture(config_, (*weights)->config()), source));
    if (staged_mirror_.ReadyFor(**weights)) {
      // Uploaded while serving (StageOnDevice): one device-to-device copy into the served
      // mirror, whose pointers (captured in the decode graphs) do not change.
      RETURN_IF_ERROR(staged_mirror_.CopyInto(**weights, backend_.get(), device_.get()));
    } else {
      spdlog::info("activation of {}: no device copy staged, copying {:.2f} GiB from host memory",
                   source.empty() ? std::string("staged weights") : source,
                   static_cast<double>((*weights)->TotalBytes()) / (1 << 30));
      RETURN_IF_ERROR(RefreshMirror(**weights, "", backend_.get(), device_.get()));
    }
    std::swap(host_, *weights);  // the old host copy goes back to the caller (freed off-thread)
    return absl::OkStatus();
  }
  absl::StatusOr<DeviceStageStep> StageOnDevice(const Weights& staged, int64_t max_bytes) override {
    RETURN_IF_ERROR(CheckSameArchitecture(config_, staged.config()));
    return staged_mirror_.Step(
        staged, max_bytes, backend_.get(), [this]() -> absl::StatusOr<int64_t> {
          // The engine thread, bound to the runner's device (every forward runs here).
          size_t free_bytes = 0;
          size_t total_bytes = 0;
          RETURN_IF_ERROR(RL_GPU_STATUS(cudaMemGetInfo(&free_bytes, &total_bytes)));
          return static_cast<int64_t>(free_bytes);
        });
  }
  absl::Status UpdateWeight(const TensorInfo& info, absl::Span<const uint8_t> bytes) override {
    RETURN_IF_ERROR(host_->Update(info, bytes));
    return RefreshMirror(*host_, info.name, backend_.get(), device_.get());
  }

 private:
  explicit CudaModelRunner(const RunnerOptions& o)
      : staged_mirror_({.fp32_lm_head = o.fp32_lm_head, .fp32_router = o.fp32_router}) {}

  model_io::ModelConfig config_;
  int32_t page_size_ = 16;
  // Destroyed in reverse order: the transformer's and the mirror's device memory go before the
  // backend's stream and cuBLAS handle.
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Weights> host_;
  std::unique_ptr<Weights> device_;
  // A staged version's device copy (model/staged_mirror.h); before the transformer so it is
  // freed after it, and before the backend is.
  StagedMirror staged_mirror_;
  std::unique_ptr<Transformer> transformer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaModelRunner(const RunnerOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaModelRunner> r, CudaModelRunner::Create(options));
  return std::unique_ptr<ModelRunner>(std::move(r));
}

}  // namespace rl::model
