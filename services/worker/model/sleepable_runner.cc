#include "services/worker/model/sleepable_runner.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_io/dtype.h"
#include "common/model_io/file_read.h"
#include "common/model_io/model_config.h"
#include "common/model_io/safetensors.h"
#include "common/status.h"
#include "services/worker/model/weights.h"

namespace rl::model {
namespace {

constexpr int kMaxFolderEntries = 100'000;
constexpr char kUnknownIdentity[] = "?";  // never equals a listed folder

}  // namespace

absl::StatusOr<std::string> FolderIdentity(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  int seen = 0;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (++seen > kMaxFolderEntries) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": more than ", kMaxFolderEntries, " entries"));
    }
    const std::string name = it->path().filename().string();
    if (name != "config.json" && !absl::EndsWith(name, ".safetensors") &&
        !absl::EndsWith(name, ".safetensors.index.json")) {
      continue;
    }
    struct stat st;
    if (::stat(it->path().c_str(), &st) != 0) continue;
    files.push_back(absl::StrCat(name, " ", st.st_size, " ", st.st_ino, " ", st.st_mtim.tv_sec, ".",
                                 st.st_mtim.tv_nsec));
  }
  if (ec) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  return absl::StrJoin(files, "\n");
}

namespace {

// OK when `dir` still has `identity`; else why waking from it would be wrong.
absl::Status CheckUnchanged(const std::string& dir, const std::string& identity, const char* how) {
  absl::StatusOr<std::string> now = FolderIdentity(dir);
  if (now.ok() && *now == identity && identity != kUnknownIdentity) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      dir, " changed on disk since it was ", how,
      " (or is gone); waking would serve other weights under the same version. Send "
      "UpdateWeightsFromDisk (applied on wake) to serve what is there now, then ResumeMemory"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SleepableRunner>> SleepableRunner::Create(Factory factory,
                                                                         std::string spill_dir,
                                                                         std::string model_dir) {
  std::unique_ptr<SleepableRunner> r(new SleepableRunner());
  r->factory_ = std::move(factory);
  r->spill_dir_ = std::move(spill_dir);
  r->model_dir_ = std::move(model_dir);
  if (!r->model_dir_.empty()) {
    r->source_identity_ = FolderIdentity(r->model_dir_).value_or(kUnknownIdentity);
  }
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

absl::Status SleepableRunner::Forward(const ForwardInput& in, ForwardOutput* out) {
  RETURN_IF_ERROR(Awake());
  return inner_->Forward(in, out);
}

std::vector<TensorInfo> SleepableRunner::ListWeights() const {
  return inner_ ? inner_->ListWeights() : infos_;
}

absl::Status SleepableRunner::VisitWeights(
    const std::function<void(const TensorInfo&, absl::Span<const uint8_t>)>& fn) const {
  RETURN_IF_ERROR(Awake());
  return inner_->VisitWeights(fn);
}

absl::Status SleepableRunner::LoadWeightsFromDisk(const std::string& model_dir) {
  // Taken before reading: a save racing with the load shows up as a change on wake. A folder
  // that cannot be listed is left to the loader's own error.
  std::string identity = FolderIdentity(model_dir).value_or(kUnknownIdentity);
  if (inner_ == nullptr) {
    // Asleep: check what can be checked without device memory, stage the folder.
    ASSIGN_OR_RETURN(model_io::ModelConfig config, model_io::LoadModelConfig(model_dir));
    RETURN_IF_ERROR(Annotate(CheckSameArchitecture(config_, config), model_dir));
    ASSIGN_OR_RETURN(model_io::Checkpoint checkpoint, model_io::OpenCheckpoint(model_dir));
    for (const TensorInfo& held : infos_) {
      const model_io::TensorView* t = checkpoint.Find(held.name);
      if (t != nullptr && t->shape != held.shape) {
        return absl::InvalidArgumentError(
            absl::StrCat(model_dir, ": tensor '", held.name, "' has another shape"));
      }
    }
    staged_path_ = model_dir;
    staged_identity_ = std::move(identity);
    staged_.clear();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(inner_->LoadWeightsFromDisk(model_dir));
  loaded_from_ = model_dir;
  source_identity_ = std::move(identity);
  dirty_ = false;
  return absl::OkStatus();
}

absl::Status SleepableRunner::ActivateWeights(std::unique_ptr<Weights>* weights,
                                              const std::string& source,
                                              const std::string& source_identity) {
  if (inner_ == nullptr) {
    if (source.empty()) {
      return absl::FailedPreconditionError("ActivateWeights: asleep, and no folder to stage");
    }
    RETURN_IF_ERROR(LoadWeightsFromDisk(source));
    weights->reset();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(inner_->ActivateWeights(weights, source, source_identity));
  if (source_identity.empty()) {
    dirty_ = true;  // not known to match the folder: a Release spills these weights
  } else {
    loaded_from_ = source;
    source_identity_ = source_identity;
    dirty_ = false;
  }
  return absl::OkStatus();
}

absl::Status SleepableRunner::UpdateWeight(const TensorInfo& info,
                                           absl::Span<const uint8_t> bytes) {
  if (inner_ == nullptr) {
    // Asleep: check against the held weights and keep a host copy until Resume.
    const TensorInfo* held = nullptr;
    for (const TensorInfo& t : infos_) {
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
        inner_->VisitWeights([&](const TensorInfo& info, absl::Span<const uint8_t> bytes) {
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
  released_.store(true, std::memory_order_release);
  // The weights' read buffers went to the spare pool: give them back to the system too.
  model_io::DropSpareBuffers();
  return absl::OkStatus();
}

absl::Status SleepableRunner::Resume() {
  if (inner_ != nullptr) return absl::OkStatus();
  // The folders reloaded below must hold what was loaded or staged (checked before any memory
  // is taken; the runner stays released on a refusal).
  if (!staged_path_.empty()) {
    RETURN_IF_ERROR(CheckUnchanged(staged_path_, staged_identity_, "staged"));
  } else if (!spilled_) {
    const std::string& source = loaded_from_.empty() ? model_dir_ : loaded_from_;
    if (!source.empty()) RETURN_IF_ERROR(CheckUnchanged(source, source_identity_, "loaded"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> fresh, factory_());
  if (!staged_path_.empty()) {
    // An update from disk staged while asleep replaces the spill and the last folder.
    RETURN_IF_ERROR(
        Annotate(fresh->LoadWeightsFromDisk(staged_path_), "applying the staged weights"));
    std::error_code ec;
    if (spilled_) std::filesystem::remove_all(spill_path_, ec);
    spilled_ = false;
    loaded_from_ = staged_path_;
    source_identity_ = std::move(staged_identity_);
    staged_path_.clear();
  } else if (spilled_) {
    model_io::ScopedNonFiniteWeightsAllowed served_before;  // exactly what was served
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
  released_.store(false, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace rl::model
