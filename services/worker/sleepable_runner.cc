#include "services/worker/sleepable_runner.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/model_io/dtype.h"
#include "common/model_io/file_read.h"
#include "common/model_io/model_config.h"
#include "common/model_io/safetensors.h"
#include "common/status.h"
#include "services/worker/model/weights.h"

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
  r->infos_ = r->inner_->ListWeights();
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
  return inner_ ? inner_->ListWeights() : infos_;
}

absl::Status SleepableRunner::VisitWeights(
    const std::function<void(const model::TensorInfo&, absl::Span<const uint8_t>)>& fn) const {
  RETURN_IF_ERROR(Awake());
  return inner_->VisitWeights(fn);
}

absl::Status SleepableRunner::LoadWeightsFromDisk(const std::string& model_dir) {
  if (inner_ == nullptr) {
    // Asleep: check what can be checked without device memory, stage the folder.
    ASSIGN_OR_RETURN(model_io::ModelConfig config, model_io::LoadModelConfig(model_dir));
    RETURN_IF_ERROR(Annotate(model::CheckSameArchitecture(config_, config), model_dir));
    ASSIGN_OR_RETURN(model_io::Checkpoint checkpoint, model_io::OpenCheckpoint(model_dir));
    for (const model::TensorInfo& held : infos_) {
      const model_io::TensorView* t = checkpoint.Find(held.name);
      if (t != nullptr && t->shape != held.shape) {
        return absl::InvalidArgumentError(
            absl::StrCat(model_dir, ": tensor '", held.name, "' has another shape"));
      }
    }
    staged_path_ = model_dir;
    staged_.clear();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(inner_->LoadWeightsFromDisk(model_dir));
  loaded_from_ = model_dir;
  dirty_ = false;
  return absl::OkStatus();
}

absl::Status SleepableRunner::UpdateWeight(const model::TensorInfo& info,
                                           absl::Span<const uint8_t> bytes) {
  if (inner_ == nullptr) {
    // Asleep: check against the held weights and keep a host copy until Resume.
    const model::TensorInfo* held = nullptr;
    for (const model::TensorInfo& t : infos_) {
      if (t.name == info.name) held = &t;
    }
    if (held == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", info.name, "': no such weight"));
    }
    const std::optional<model_io::DType> dtype = model_io::ParseDType(info.dtype);
    if (!dtype || info.shape != held->shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", info.name, "': dtype or shape differs from the model's"));
    }
    int64_t numel = 1;
    for (int64_t d : info.shape) numel *= d;
    if (static_cast<int64_t>(bytes.size()) != numel * model_io::DTypeSize(*dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", info.name, "': ", bytes.size(),
                                                     " bytes for its dtype and shape"));
    }
    staged_[info.name] = {info, std::vector<uint8_t>(bytes.begin(), bytes.end())};
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(inner_->UpdateWeight(info, bytes));
  dirty_ = true;
  return absl::OkStatus();
}

absl::Status SleepableRunner::Release() {
  if (inner_ == nullptr) return absl::OkStatus();
  infos_ = inner_->ListWeights();
  spilled_ = false;
  if (dirty_) {
    // Copy every tensor, then write them as one safetensors file.
    std::vector<std::vector<uint8_t>> copies;
    std::vector<model_io::TensorToWrite> tensors;
    RETURN_IF_ERROR(
        inner_->VisitWeights([&](const model::TensorInfo& info, absl::Span<const uint8_t> bytes) {
          copies.emplace_back(bytes.begin(), bytes.end());
          tensors.push_back({info.name, *model_io::ParseDType(info.dtype), info.shape, {}});
        }));
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = copies[i];
    // A fresh folder each time: the weights being spilled may be mapped from the previous one.
    spill_path_ = absl::StrCat(spill_dir_, "/spill-", ++num_spills_);
    std::error_code ec;
    std::filesystem::create_directories(spill_path_, ec);
    if (ec) return absl::InternalError(absl::StrCat("spill dir ", spill_path_, ": ", ec.message()));
    RETURN_IF_ERROR(
        Annotate(model_io::WriteSafetensors(spill_path_ + "/model.safetensors", tensors),
                 "spilling updated weights before release"));
    spilled_ = true;
  }
  inner_.reset();
  // The weights' read buffers went to the spare pool: give them back to the system too.
  model_io::DropSpareBuffers();
  return absl::OkStatus();
}

absl::Status SleepableRunner::Resume() {
  if (inner_ != nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::unique_ptr<model::ModelRunner> fresh, factory_());
  if (!staged_path_.empty()) {
    // An update from disk staged while asleep replaces the spill and the last folder.
    RETURN_IF_ERROR(
        Annotate(fresh->LoadWeightsFromDisk(staged_path_), "applying the staged weights"));
    std::error_code ec;
    if (spilled_) std::filesystem::remove_all(spill_path_, ec);
    spilled_ = false;
    loaded_from_ = staged_path_;
    staged_path_.clear();
  } else if (spilled_) {
    RETURN_IF_ERROR(Annotate(fresh->LoadWeightsFromDisk(spill_path_), "restoring spilled weights"));
  } else if (!loaded_from_.empty()) {
    RETURN_IF_ERROR(Annotate(fresh->LoadWeightsFromDisk(loaded_from_), "restoring weights"));
  }
  // Tensors staged while asleep go on top of the base weights.
  for (const auto& [name, staged] : staged_) {
    RETURN_IF_ERROR(
        Annotate(fresh->UpdateWeight(staged.first, staged.second), "applying a staged tensor"));
  }
  // The restored weights stay "dirty" relative to loaded_from_ when they came from the spill or
  // include staged tensors.
  dirty_ = spilled_ || !staged_.empty();
  staged_.clear();
  if (spilled_) {
    // Unlinking is safe: a mapping keeps the file's pages alive until the weights change.
    std::error_code ec;
    std::filesystem::remove_all(spill_path_, ec);
  }
  inner_ = std::move(fresh);
  return absl::OkStatus();
}

}  // namespace rl::worker
