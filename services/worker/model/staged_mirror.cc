#include "services/worker/model/staged_mirror.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace rl::model {
namespace {

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / static_cast<double>(1 << 30));
}

}  // namespace

DeviceStagingDecision DecideDeviceStaging(int64_t needed, int64_t free_bytes, int64_t reserve) {
  DeviceStagingDecision d;
  if (needed < 0 || free_bytes < 0 || reserve < 0) {
    d.reason = "device memory unknown";
    return d;
  }
  // needed + reserve without a sum that can wrap.
  if (free_bytes < reserve || needed > free_bytes - reserve) {
    d.reason = absl::StrCat("a second device copy needs ", GiB(needed), " + ", GiB(reserve),
                            " reserve, ", GiB(free_bytes), " free");
    return d;
  }
  d.on_device = true;
  return d;
}

int64_t MirrorBytes(const Weights& host, bool fp32_lm_head, bool fp32_router) {
  int64_t total = host.TotalBytes();
  auto f32_extra = [](const WeightTensor* t) -> int64_t {
    if (t == nullptr || t->dtype == model_io::DType::kF32) return 0;
    return t->num_bytes / model_io::DTypeSize(t->dtype) * static_cast<int64_t>(sizeof(float));
  };
  if (fp32_lm_head) total += f32_extra(&host.lm_head());
  if (fp32_router) {
    for (int64_t i = 0; i < host.config().num_hidden_layers; ++i) {
      total += f32_extra(host.layer(i).router);
    }
  }
  return total;
}

absl::StatusOr<DeviceStageStep> StagedMirror::Step(
    const Weights& staged, int64_t max_bytes, Backend* backend,
    const std::function<absl::StatusOr<int64_t>()>& free_bytes) {
  if (backend == nullptr) return absl::InvalidArgumentError("StagedMirror: null backend");
  DeviceStageStep out;
  if (serial_ != staged.serial()) {
    // A new source: (re)start. Allocate once; later stages of the same layout reuse the memory.
    serial_ = 0;
    next_ = 0;
    names_.clear();
    if (mirror_ != nullptr && CheckSameArchitecture(mirror_->config(), staged.config()).ok() &&
        bytes_ == MirrorBytes(staged, options_.fp32_lm_head, options_.fp32_router)) {
      // Same layout: reuse.
    } else {
      mirror_.reset();  // freed before the new one is allocated
      bytes_ = 0;
      const int64_t needed = MirrorBytes(staged, options_.fp32_lm_head, options_.fp32_router);
      ASSIGN_OR_RETURN(const int64_t free, free_bytes());
      const DeviceStagingDecision d = DecideDeviceStaging(needed, free, options_.reserve_bytes);
      if (!d.on_device) {
        out.note =
            absl::StrCat("staged in host memory (copied to the device at activation): ", d.reason);
        return out;
      }
      absl::StatusOr<std::unique_ptr<Weights>> m =
          AllocateMirror(staged, backend, options_.fp32_lm_head, options_.fp32_router);
      if (!m.ok()) {
        out.note = absl::StrCat(
            "staged in host memory (copied to the device at activation): allocation failed: ",
            m.status().message());
        return out;
      }
      mirror_ = *std::move(m);
      bytes_ = needed;
    }
    for (const TensorInfo& t : staged.List()) names_.push_back(t.name);
    serial_ = staged.serial();
  }
  out.on_device = true;
  int64_t copied = 0;
  while (next_ < names_.size() && (copied == 0 || copied < max_bytes)) {
    const std::string& name = names_[next_];
    if (absl::Status s = RefreshMirror(staged, name, backend, mirror_.get()); !s.ok()) {
      serial_ = 0;  // partial: never ready
      return s;
    }
    copied += staged.Find(name)->num_bytes;
    ++next_;
  }
  out.done = next_ == names_.size();
  if (out.done) out.note = absl::StrCat("staged on the device too (", GiB(bytes_), ")");
  return out;
}

absl::Status StagedMirror::CopyInto(const Weights& staged, Backend* backend, Weights* served) {
  if (!ReadyFor(staged)) {
    return absl::FailedPreconditionError("StagedMirror: no complete device copy of these weights");
  }
  RETURN_IF_ERROR(CopyMirror(*mirror_, backend, served));
  serial_ = 0;  // the buffers are free for the next stage
  return absl::OkStatus();
}

}  // namespace rl::model
