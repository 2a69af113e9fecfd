// CpuModelRunner: the ModelRunner on the CPU backend — the test oracle and the fallback that
// runs everywhere. Batch-invariant by construction (see kernels/cpu): a sequence's logits are
// bit-identical whatever else is in the batch and wherever it sits.
//
// Memory: weights are memory-mapped in their stored dtype; the KV cache is float32,
// KvBytesPerSlot = layers · 2 · kv_heads · head_dim · 4 bytes per token slot, allocated once
// (pages committed on first use).
// Thread safety: as ModelRunner (engine thread only).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/worker/model/backend.h"
#include "services/worker/model/model_runner.h"
#include "services/worker/model/transformer.h"
#include "services/worker/model/weights.h"

namespace rl::model {

struct RunnerOptions {
  std::string model_dir;
  int32_t page_size = 16;
  // KV cache size: num_kv_slots when > 0, else kv_cache_bytes / bytes per slot; rounded down to
  // whole pages.
  int64_t num_kv_slots = 0;
  int64_t kv_cache_bytes = int64_t{256} << 20;
  int num_threads = 0;  // 0: hardware concurrency
  // CUDA runner only (cuda_runner.h): the device, the share of its free memory (after the
  // weights) the KV cache takes when kv_cache_bytes is 0, the batch-invariant GEMMs, an FP32
  // copy of a 16-bit LM head, and CUDA graphs for decode.
  int cuda_device = 0;
  double gpu_memory_fraction = 0.85;
  bool batch_invariant = false;
  bool fp32_lm_head = false;
  // MoE router (gate) GEMM in float32: on CUDA an FP32 copy of a 16-bit gate; the CPU backend
  // always widens weights to float32, so it changes nothing there.
  bool fp32_router = false;
  bool cuda_graphs = true;  // capture decode steps in CUDA graphs (transformer.h)
  // KV cache element type: "auto" (float32 on the CPU, bfloat16 on CUDA), "float32", or
  // "bfloat16" (CUDA only).
  std::string kv_cache_dtype = "auto";
  // After the startup load, reserve spare read buffers of the checkpoint's size
  // (Weights::ReserveUpdateBuffers): the first UpdateWeightsFromDisk is then as fast as later
  // ones, at the cost of a second, reclaimable (MADV_FREE) copy of the weights in host memory.
  bool reserve_update_buffers = true;
};

class CpuModelRunner final : public ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<CpuModelRunner>> Create(const RunnerOptions& options);

  const model_io::ModelConfig& config() const override { return config_; }
  std::string backend_name() const override { return "cpu"; }
  int64_t num_kv_slots() const override { return transformer_->num_kv_slots(); }
  int32_t page_size() const override { return page_size_; }
  absl::Status Forward(const ForwardInput& in, ForwardOutput* out) override;

  std::vector<TensorInfo> ListWeights() const override { return weights_->List(); }
  absl::Status VisitWeights(const std::function<void(const TensorInfo&, absl::Span<const uint8_t>)>&
                                fn) const override;
  absl::Status LoadWeightsFromDisk(const std::string& model_dir) override;
  absl::Status UpdateWeight(const TensorInfo& info, absl::Span<const uint8_t> bytes) override;

  // Swaps in weights loaded for this config (LoadWeights(dir, config())). Null is refused.
  absl::Status SwapWeights(std::unique_ptr<Weights> weights);
  const Weights& weights() const { return *weights_; }

 private:
  CpuModelRunner() = default;

  model_io::ModelConfig config_;
  int32_t page_size_ = 16;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<Transformer> transformer_;
};

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuModelRunner(const RunnerOptions& options);

}  // namespace rl::model
