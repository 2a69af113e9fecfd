// CpuModelRunner: the ModelRunner on the CPU backend — the test oracle and the fallback that
// runs everywhere. Batch-invariant by construction (see kernels/cpu): a sequence's logits are
// bit-identical whatever else is in the batch and wherever it sits.
//
// Memory: weights are read into memory the process owns, in their stored dtype; the KV cache
// is float32, KvBytesPerSlot = layers · 2 · kv_heads · head_dim · 4 bytes per token slot,
// allocated once, its pages committed up front (no page fault when a decode step writes a new
// slot), in 2 MiB pages with cpu_huge_pages (CpuBackendOptions::huge_page_kv_cache: decode
// attention reads one KV head's slice of each slot's row, a page per position in 4 KiB pages).
// The served weights are moved into 2 MiB pages in the background after every load or swap
// (cpu_huge_pages.h: batch-1 decode streams them and a TLB miss per 4 KiB cost it 8-10%).
// Thread safety: as ModelRunner (engine thread only).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu/op_profile.h"
#include "services/worker/model/backend.h"
#include "services/worker/model/cpu_huge_pages.h"
#include "services/worker/model/model_runner.h"
#include "services/worker/model/runner_options.h"
#include "services/worker/model/transformer.h"
#include "services/worker/model/weights.h"

namespace rl::model {

class CpuModelRunner final : public ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<CpuModelRunner>> Create(const RunnerOptions& options);

  const model_io::ModelConfig& config() const override { return config_; }
  std::string backend_name() const override { return "cpu"; }
  int64_t num_kv_slots() const override { return transformer_->num_kv_slots(); }
  int32_t page_size() const override { return page_size_; }
  absl::Status Forward(const ForwardInput& in, ForwardOutput* out) override;

  std::vector<TensorInfo> ListWeights() const override { return weights_->List(); }
  absl::Status VisitWeights(
      const std::function<void(const TensorInfo&, absl::Span<const uint8_t>)>& fn) const override;
  absl::Status LoadWeightsFromDisk(const std::string& model_dir) override;
  absl::Status UpdateWeight(const TensorInfo& info, absl::Span<const uint8_t> bytes) override;
  absl::Status ActivateWeights(std::unique_ptr<Weights>* weights, const std::string& source,
                               const std::string& source_identity) override;

  // Swaps in weights loaded for this config (LoadWeights(dir, config())). Null is refused.
  absl::Status SwapWeights(std::unique_ptr<Weights> weights);
  const Weights& weights() const { return *weights_; }

  // Per-op times of every Forward since the last Clear(), with RunnerOptions::cpu_op_profile;
  // null without it.
  kernels::cpu::OpProfile* op_profile() { return op_profile_.get(); }

  // Waits until the served weights' move into 2 MiB pages is done (or refused); for benchmarks
  // and tests, which should not time a forward pass while it runs.
  HugePageCollapser::Stats WaitForHugePages() { return huge_pages_.Wait(); }
  // Each layer's K and V cache buffer (tests check where they live).
  std::vector<absl::Span<const uint8_t>> KvCacheBytes() const {
    return transformer_->KvCacheBytes();
  }

 private:
  CpuModelRunner() = default;
  // Starts moving the served weights into 2 MiB pages (replacing a move in progress).
  void CollapseServedWeights();

  model_io::ModelConfig config_;
  int32_t page_size_ = 16;
  bool huge_pages_enabled_ = true;                       // RunnerOptions::cpu_huge_pages
  std::unique_ptr<kernels::cpu::OpProfile> op_profile_;  // outlives backend_
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<Transformer> transformer_;
  HugePageCollapser huge_pages_;  // destroyed (its thread joined) first
};

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuModelRunner(const RunnerOptions& options);

}  // namespace rl::model
