// SleepableRunner: a ModelRunner wrapper that can free its backend (weights and KV cache) and
// re-create it later: the mechanism under ReleaseMemory / ResumeMemory (sleep / wake).
//
// Design: Release destroys the inner runner, first spilling weights changed in memory since
// their last load to a safetensors file; Resume re-creates it from the factory and reloads the
// last weights (staged folder, else spill, else last folder), refusing with
// FAILED_PRECONDITION (still released) when a folder to reload changed on disk since it was
// read. Updates while released are checked against the held shapes and staged (a folder, or
// host copies of tensors), and served on Resume. While released, Forward and VisitWeights fail
// with FAILED_PRECONDITION; config(), sizes and ListWeights() stay available.
// It is the one owner of the worker's asleep state: released() (docs/worker-control.md).
// Cost: a release of updated weights writes every tensor once (model bytes of disk); a resume
// is a full model load.
// Thread-safety: released() from any thread; everything else on the engine thread only.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/worker/model/model_runner.h"

namespace rl::model {

// Identity of a checkpoint folder: name, size, inode and modification time of config.json and
// every safetensors file (and index), sorted. Saving a checkpoint over the folder changes it.
absl::StatusOr<std::string> FolderIdentity(const std::string& dir);

class SleepableRunner final : public ModelRunner {
 public:
  using Factory = std::function<absl::StatusOr<std::unique_ptr<ModelRunner>>()>;

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
  absl::Status Forward(const ForwardInput& in, ForwardOutput* out) override;
  std::vector<TensorInfo> ListWeights() const override;
  absl::Status VisitWeights(
      const std::function<void(const TensorInfo&, absl::Span<const uint8_t>)>& fn) const override;
  absl::Status LoadWeightsFromDisk(const std::string& model_dir) override;
  absl::Status UpdateWeight(const TensorInfo& info, absl::Span<const uint8_t> bytes) override;
  // Awake: the inner runner's; `source` becomes the folder a wake reloads from, checked against
  // `source_identity` (taken before the read) like a LoadWeightsFromDisk; with no identity the
  // weights count as changed in memory and a Release spills them. Asleep: the read-ahead copy is
  // dropped and `source` is staged as by LoadWeightsFromDisk.
  absl::Status ActivateWeights(std::unique_ptr<Weights>* weights, const std::string& source,
                               const std::string& source_identity) override;
  // Awake: the inner runner's. Asleep: nothing on the device (the version stays host-staged).
  absl::StatusOr<DeviceStageStep> StageOnDevice(const Weights& staged, int64_t max_bytes) override {
    if (inner_ == nullptr) return DeviceStageStep{.note = "asleep: staged in host memory"};
    return inner_->StageOnDevice(staged, max_bytes);
  }

  // Whether the backend is freed (the worker is asleep). Any thread: it changes only at the end
  // of a successful Release or Resume (on the engine thread).
  bool released() const { return released_.load(std::memory_order_acquire); }
  // Frees the backend (no-op when released). On an error nothing is freed.
  absl::Status Release();
  // Re-creates the backend with the last (or staged) weights (no-op when awake). On an error
  // the runner stays released.
  absl::Status Resume();

 private:
  SleepableRunner() = default;
  absl::Status Awake() const;

  Factory factory_;
  std::string spill_dir_;
  std::unique_ptr<ModelRunner> inner_;  // null while released
  std::atomic<bool> released_{false};   // inner_ == nullptr, published for other threads
  model_io::ModelConfig config_;
  std::string backend_name_;
  int64_t num_kv_slots_ = 0;
  int32_t page_size_ = 0;
  std::string model_dir_;        // the factory's folder
  std::string loaded_from_;      // last LoadWeightsFromDisk path ("" = the factory's weights)
  std::string source_identity_;  // FolderIdentity of loaded_from_ (or model_dir_) before loading
  bool dirty_ = false;           // weights changed in memory since loaded_from_
  bool spilled_ = false;
  std::string spill_path_;
  int num_spills_ = 0;
  std::vector<TensorInfo> infos_;  // the held weights (for checks while released)
  std::string staged_path_;        // a from-disk update staged while released
  std::string staged_identity_;
  std::map<std::string, std::pair<TensorInfo, std::vector<uint8_t>>> staged_;
};

}  // namespace rl::model
