// SleepableRunner: a ModelRunner wrapper that can free its backend (weights and KV cache) and
// re-create it later (ReleaseMemory / ResumeMemory).
//
// Release destroys the inner runner; weights that were changed in memory since they were last
// loaded from disk (UpdateWeight, WeightsChecker reset) are first written to a spill file so
// Resume restores exactly what was served. Resume re-creates the runner from the factory and
// reloads the last weights (the last from-disk path, then the spill).
//
// Weight updates while released are staged and become the served weights on Resume:
// LoadWeightsFromDisk checks the folder (config.json of the same architecture, a readable
// checkpoint with the held shapes) and stages the path (it replaces everything staged or
// spilled before; the folder must stay in place until Resume); UpdateWeight checks the tensor
// against the held names, shapes and sizes and stages a copy in host memory (applied on top of
// the base weights on Resume). While released, Forward and VisitWeights fail with
// FAILED_PRECONDITION; config(), sizes and ListWeights() stay available.
//
// A folder reloaded on Resume (the start-up model, the last loaded or the staged one) must be
// the one that was loaded or staged: each folder's file identity (name, size, inode, mtime of
// config.json and the safetensors files) is recorded before it is read, and Resume refuses
// with FAILED_PRECONDITION, staying released, when it changed (a trainer saving its next
// checkpoint over the folder): waking would otherwise serve other weights under the same
// version. A disk update sent while released replaces what is reloaded.
// Not thread-safe: used on the engine thread only.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/worker/model/model_runner.h"

namespace rl::worker {

class SleepableRunner final : public model::ModelRunner {
 public:
  using Factory = std::function<absl::StatusOr<std::unique_ptr<model::ModelRunner>>()>;

  // Creates the first inner runner. `spill_dir` receives spilled weights (created on demand).
  // `model_dir` is the folder the factory loads (checked on Resume; "" skips the check).
  static absl::StatusOr<std::unique_ptr<SleepableRunner>> Create(Factory factory,
                                                                 std::string spill_dir,
                                                                 std::string model_dir = "");
  ~SleepableRunner() override;

  const model_io::ModelConfig& config() const override { return config_; }
  std::string backend_name() const override { return backend_name_; }
  int64_t num_kv_slots() const override { return num_kv_slots_; }
  int32_t page_size() const override { return page_size_; }
  absl::Status Forward(const model::ForwardInput& in, model::ForwardOutput* out) override;
  std::vector<model::TensorInfo> ListWeights() const override;
  absl::Status VisitWeights(
      const std::function<void(const model::TensorInfo&, absl::Span<const uint8_t>)>& fn)
      const override;
  absl::Status LoadWeightsFromDisk(const std::string& model_dir) override;
  absl::Status UpdateWeight(const model::TensorInfo& info,
                            absl::Span<const uint8_t> bytes) override;

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
  std::string model_dir_;    // the factory's folder
  std::string loaded_from_;  // last LoadWeightsFromDisk path ("" = the factory's weights)
  std::string source_identity_;  // FolderIdentity of loaded_from_ (or model_dir_) before loading
  bool dirty_ = false;       // weights changed in memory since loaded_from_
  bool spilled_ = false;
  std::string spill_path_;
  int num_spills_ = 0;
  std::vector<model::TensorInfo> infos_;  // the held weights (for checks while released)
  std::string staged_path_;               // a from-disk update staged while released
  std::string staged_identity_;
  std::map<std::string, std::pair<model::TensorInfo, std::vector<uint8_t>>> staged_;
};

}  // namespace rl::worker
