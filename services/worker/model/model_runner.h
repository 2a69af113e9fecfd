// ModelRunner: the interface between the engine (scheduler, KV allocator, sampler) and a
// backend (CPU oracle, CUDA). The runner makes no policy decisions: it runs one mixed batch of
// prefill chunks and decode tokens through the model, reading and writing the KV cache through
// the slot indices the engine allocated, and returns logits for the rows asked for.
//
// KV layout contract: the runner owns `num_kv_slots()` token slots per layer; slot s belongs to
// page s / page_size. The engine's allocator hands out slots; the runner never allocates.
// Thread safety: not thread-safe; called only from the engine thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_io/model_config.h"
#include "services/worker/model/forward_batch.h"

namespace rl::model {

class Weights;  // model/weights.h

// Progress of one ModelRunner::StageOnDevice step (model/staged_mirror.h).
struct DeviceStageStep {
  bool done = true;        // nothing more to upload (complete, or host-staged)
  bool on_device = false;  // the staged version has (or is getting) a device copy
  std::string note;        // what was done or why not, for the log
};

// Description of one weight tensor as the runner holds it.
struct TensorInfo {
  std::string name;   // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::string dtype;  // "F32", "BF16", "F16"
  std::vector<int64_t> shape;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const model_io::ModelConfig& config() const = 0;
  virtual std::string backend_name() const = 0;  // "cpu", "cuda"
  virtual int64_t num_kv_slots() const = 0;
  virtual int32_t page_size() const = 0;

  // Runs one batch. `out` is overwritten. Errors (bad slots, positions past the context)
  // leave the KV cache of the sequences in the batch unspecified but never crash.
  virtual absl::Status Forward(const ForwardInput& in, ForwardOutput* out) = 0;

  // ---- Weights (UpdateWeightsFromDisk / FromTensor / WeightsChecker / ListWeights) ----
  // Runners that cannot do these answer UNIMPLEMENTED. Same thread rules as Forward.

  // Every weight tensor as held, sorted by name (tied LM heads are not listed separately).
  virtual std::vector<TensorInfo> ListWeights() const { return {}; }
  // Calls fn(info, bytes) for every tensor in name order; `bytes` are the raw little-endian
  // values in info.dtype, valid only during the call.
  virtual absl::Status VisitWeights(
      const std::function<void(const TensorInfo&, absl::Span<const uint8_t>)>& fn) const {
    return absl::UnimplementedError("VisitWeights");
  }
  // Loads the checkpoint in `model_dir`, checks every tensor against this model's config
  // (errors name the tensor and the expected shape) and swaps it in atomically. On error the
  // old weights keep serving. The KV cache is not cleared (the engine flushes it).
  virtual absl::Status LoadWeightsFromDisk(const std::string& model_dir) {
    return absl::UnimplementedError("LoadWeightsFromDisk");
  }
  // Replaces one tensor from raw bytes: info.name must exist, info.shape must equal the held
  // shape, info.dtype is F32/BF16/F16 (converted to the held dtype). Nothing changes on error.
  virtual absl::Status UpdateWeight(const TensorInfo& info, absl::Span<const uint8_t> bytes) {
    return absl::UnimplementedError("UpdateWeight");
  }
  // Serves `*weights`, read ahead (model::LoadWeights, off the engine thread: a staged version,
  // docs/weight-updates.md) from folder `source`: checks the architecture, then swaps them in
  // (CPU: a pointer swap; CUDA: a copy into the device mirror, then the host copy is swapped).
  // On success `*weights` holds the weights served before (or null), for the caller to free
  // after the pause, off the engine thread; on error it and the served weights are left as they
  // were. The KV cache is not cleared (the engine flushes it). `source_identity` is the folder's
  // FolderIdentity (sleepable_runner.h) taken before the read, "" when unknown.
  virtual absl::Status ActivateWeights(std::unique_ptr<Weights>* weights, const std::string& source,
                                       const std::string& source_identity) {
    return absl::UnimplementedError("ActivateWeights");
  }
  // Prepares `staged` (a version read into host memory, activated later by ActivateWeights
  // with these very weights) for a short activation, at most `max_bytes` of it per call, on the
  // engine thread between steps; `done` once nothing is left. CUDA uploads it into a second
  // device copy when memory allows (model/staged_mirror.h), so the activation is one
  // device-to-device copy; else it stays host-staged and `note` says why. Default (CPU: the
  // host copy is what serves): done at once, nothing to do.
  virtual absl::StatusOr<DeviceStageStep> StageOnDevice(const Weights& staged, int64_t max_bytes) {
    return DeviceStageStep{};
  }
};

}  // namespace rl::model
