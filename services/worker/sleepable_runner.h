// SleepableRunner: a ModelRunner wrapper that can free its backend (weights and KV cache) and
// re-create it later (ReleaseMemory / ResumeMemory).
//
// Release destroys the inner runner; weights that were changed in memory since they were last
// loaded from disk (UpdateWeight, WeightsChecker reset) are first written to a spill file so
// Resume restores exactly what was served. Resume re-creates the runner from the factory and
// reloads the last weights (the last from-disk path, then the spill). While released, Forward
// and weight calls fail with FAILED_PRECONDITION; config() and sizes stay available.
// Not thread-safe: used on the engine thread only.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/worker/model/model_runner.h"

namespace rl::worker {

class SleepableRunner final : public model::ModelRunner {
 public:
  using Factory = std::function<absl::StatusOr<std::unique_ptr<model::ModelRunner>>()>;

  // Creates the first inner runner. `spill_dir` receives spilled weights (created on demand).
  static absl::StatusOr<std::unique_ptr<SleepableRunner>> Create(Factory factory,
                                                                 std::string spill_dir);
  ~SleepableRunner() override;

  const model_io::ModelConfig& config() const override { return config_; }
  std::string backend_name() const override { return backend_name_; }
  int64_t num_kv_slots() const override { return num_kv_slots_; }
  int32_t page_size() const override { return page_size_; }
  absl::Status Forward(const model::ForwardInput& in, model::ForwardOutput* out) override;
  std::vector<model::TensorInfo> ListWeights() const override;
  absl::Status VisitWeights(const std::function<void(const model::TensorInfo&,
                                                     absl::Span<const uint8_t>)>& fn) const override;
  absl::Status LoadWeightsFromDisk(const std::string& model_dir) override;
  absl::Status UpdateWeight(const model::TensorInfo& info, absl::Span<const uint8_t> bytes) override;

  bool released() const { return inner_ == nullptr; }
  absl::Status Release();
  absl::Status Resume();

 private:
  SleepableRunner() = default;
  absl::Status Awake() const;

  Factory factory_;
  std::string spill_dir_;
  std::unique_ptr<model::ModelRunner> inner_;
  model_io::ModelConfig config_;
  std::string backend_name_;
  int64_t num_kv_slots_ = 0;
  int32_t page_size_ = 0;
  std::string loaded_from_;  // last LoadWeightsFromDisk path ("" = the factory's weights)
  bool dirty_ = false;       // weights changed in memory since loaded_from_
  bool spilled_ = false;
  std::string spill_path_;
  int num_spills_ = 0;
};

}  // namespace rl::worker
