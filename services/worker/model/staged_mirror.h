// StagedMirror: a second copy of the weights in backend (device) memory, so activating a staged
// version is a device-to-device copy instead of a host-to-device upload inside the pause.
//
// A version staged in host memory (docs/weight-updates.md, "Staged versions") is uploaded into
// this mirror while the engine keeps serving: `Step` copies at most `max_bytes` of tensors per
// call, and the worker calls it between engine steps (one engine-thread hop per slice, so the
// backend is only ever used from the engine thread and a decode step waits for one slice at
// most). The first step decides: the mirror's bytes plus a reserve must fit in the device's
// free memory, else nothing is allocated and the version stays host-staged (activation uploads
// it as before; the reason is returned to be logged). The mirror names the host weights it was
// filled from by `Weights::serial()` (never reused, unlike an address), so `ReadyFor` is true
// only for exactly those weights, complete: a stale or partial copy is never activated.
// `CopyInto` copies it into the served mirror (Backend::CopyOnDevice, ordered on the compute
// stream): the served mirror's pointers do not change, so captured CUDA graphs and the KV pool
// stay valid. The buffers are kept for the next stage (one allocation, then reuse); the runner
// frees them with itself (sleep releases the runner).
//
// Cost: one extra device copy of the weights (allocated at the first stage that fits, held
// after); per stage one host-to-device copy of the model in slices; per activation one
// device-to-device copy (bytes / device bandwidth). Backend-agnostic: tested on the CPU backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/worker/model/backend.h"
#include "services/worker/model/model_runner.h"
#include "services/worker/model/weights.h"

namespace rl::model {

// Whether a staged version gets a device copy: `needed` bytes plus `reserve` must fit in
// `free_bytes`. `reason` says why not (for the log), empty when it does.
struct DeviceStagingDecision {
  bool on_device = false;
  std::string reason;
};
DeviceStagingDecision DecideDeviceStaging(int64_t needed, int64_t free_bytes, int64_t reserve);

// Bytes of a mirror of `host` (its tensors, plus the FP32 copies the options add).
int64_t MirrorBytes(const Weights& host, bool fp32_lm_head, bool fp32_router);

class StagedMirror {
 public:
  struct Options {
    bool fp32_lm_head = false;
    bool fp32_router = false;
    int64_t reserve_bytes = int64_t{256} << 20;  // left free for the forward's workspaces
  };
  explicit StagedMirror(Options options) : options_(options) {}

  // Uploads the next slice (at most `max_bytes`, at least one tensor) of `staged`. A step for
  // other weights than the previous steps' restarts the upload (the old copy is overwritten).
  // `free_bytes` reports the device's free memory (asked only when memory must be allocated).
  absl::StatusOr<DeviceStageStep> Step(const Weights& staged, int64_t max_bytes, Backend* backend,
                                       const std::function<absl::StatusOr<int64_t>()>& free_bytes);
  // The copy is complete and was filled from exactly `staged`.
  bool ReadyFor(const Weights& staged) const {
    return mirror_ != nullptr && serial_ == staged.serial() && next_ == names_.size();
  }
  // Copies the complete copy of `staged` into `served` (same layout); afterwards the copy is
  // no longer ready for anything (the buffers stay for the next stage).
  absl::Status CopyInto(const Weights& staged, Backend* backend, Weights* served);
  // Forgets what the buffers hold (kept allocated).
  void Invalidate() { serial_ = 0; }
  bool allocated() const { return mirror_ != nullptr; }
  int64_t bytes() const { return bytes_; }

 private:
  const Options options_;
  std::unique_ptr<Weights> mirror_;
  int64_t bytes_ = 0;
  uint64_t serial_ = 0;             // Weights::serial() of the source; 0: none
  std::vector<std::string> names_;  // upload order
  size_t next_ = 0;                 // names_[next_] is the next tensor to upload
};

}  // namespace rl::model
