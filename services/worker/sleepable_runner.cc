#include "services/worker/sleepable_runner.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/model_io/dtype.h"
#include "common/model_io/safetensors.h"
#include "common/status.h"

namespace rl::worker {

absl::StatusOr<std::unique_ptr<SleepableRunner>> SleepableRunner::Create(Factory factory,
                                                                         std::string spill_dir) {
  std::unique_ptr<SleepableRunner> r(new SleepableRunner());
  r->factory_ = std::move(factory);
  r->spill_dir_ = std::move(spill_dir);
  ASSIGN_OR_RETURN(r->inner_, r->factory_());
  r->config_ = r->inner_->config();
  r->backend_name_ = r->inner_->backend_name();
  r->num_kv_slots_ = r->inner_->num_kv_slots();
  r->page_size_ = r->inner_->page_size();
  return r;
}

SleepableRunner::~SleepableRunner() {
  std::error_code ec;
  if (num_spills_ > 0) std::filesystem::remove_all(spill_dir_, ec);
}

absl::Status SleepableRunner::Awake() const {
  if (inner_ == nullptr) {
    return absl::FailedPreconditionError("the worker is asleep (ReleaseMemory); call ResumeMemory");
  }
  return absl::OkStatus();
}

absl::Status SleepableRunner::Forward(const model::ForwardInput& in, model::ForwardOutput* out) {
  RETURN_IF_ERROR(Awake());
  return inner_->Forward(in, out);
}

std::vector<model::TensorInfo> SleepableRunner::ListWeights() const {
  return inner_ ? inner_->ListWeights() : std::vector<model::TensorInfo>{};
}

absl::Status SleepableRunner::VisitWeights(
    const std::function<void(const model::TensorInfo&, absl::Span<const uint8_t>)>& fn) const {
  RETURN_IF_ERROR(Awake());
  return inner_->VisitWeights(fn);
}

absl::Status SleepableRunner::LoadWeightsFromDisk(const std::string& model_dir) {
  RETURN_IF_ERROR(Awake());
  RETURN_IF_ERROR(inner_->LoadWeightsFromDisk(model_dir));
  loaded_from_ = model_dir;
  dirty_ = false;
  return absl::OkStatus();
}

absl::Status SleepableRunner::UpdateWeight(const model::TensorInfo& info,
                                           absl::Span<const uint8_t> bytes) {
  RETURN_IF_ERROR(Awake());
  RETURN_IF_ERROR(inner_->UpdateWeight(info, bytes));
  dirty_ = true;
  return absl::OkStatus();
}

absl::Status SleepableRunner::Release() {
  if (inner_ == nullptr) return absl::OkStatus();
  spilled_ = false;
  if (dirty_) {
    // Copy every tensor, then write them as one safetensors file.
    std::vector<std::vector<uint8_t>> copies;
    std::vector<model_io::TensorToWrite> tensors;
    RETURN_IF_ERROR(inner_->VisitWeights(
        [&](const model::TensorInfo& info, absl::Span<const uint8_t> bytes) {
          copies.emplace_back(bytes.begin(), bytes.end());
          tensors.push_back({info.name, *model_io::ParseDType(info.dtype), info.shape, {}});
        }));
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = copies[i];
    // A fresh folder each time: the weights being spilled may be mapped from the previous one.
    spill_path_ = absl::StrCat(spill_dir_, "/spill-", ++num_spills_);
    std::error_code ec;
    std::filesystem::create_directories(spill_path_, ec);
    if (ec) return absl::InternalError(absl::StrCat("spill dir ", spill_path_, ": ", ec.message()));
    RETURN_IF_ERROR(Annotate(
        model_io::WriteSafetensors(spill_path_ + "/model.safetensors", tensors),
        "spilling updated weights before release"));
    spilled_ = true;
  }
  inner_.reset();
  return absl::OkStatus();
}

absl::Status SleepableRunner::Resume() {
  if (inner_ != nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::unique_ptr<model::ModelRunner> fresh, factory_());
  if (spilled_) {
    RETURN_IF_ERROR(Annotate(fresh->LoadWeightsFromDisk(spill_path_), "restoring spilled weights"));
    // Unlinking is safe: a mapping keeps the file's pages alive until the weights change.
    std::error_code ec;
    std::filesystem::remove_all(spill_path_, ec);
  } else if (!loaded_from_.empty()) {
    RETURN_IF_ERROR(Annotate(fresh->LoadWeightsFromDisk(loaded_from_), "restoring weights"));
  }
  inner_ = std::move(fresh);
  // The restored weights stay "dirty" relative to loaded_from_ when they came from the spill.
  dirty_ = spilled_;
  return absl::OkStatus();
}

}  // namespace rl::worker
