// Weights: the tensors of one model replica, as Hugging Face names them, kept in their stored
// dtype (F32 / BF16 / F16), in memory the process owns: the safetensors files are read once
// into owned buffers (never a live mmap view), so a checkpoint saved over the same folder after
// loading changes nothing the worker serves and a truncated file can never fault it. Big bf16
// models are never widened in memory; kernels widen to float32 on the fly.
//
// Invariants: every tensor the architecture needs is present with the expected shape (checked
// at load, errors name the tensor and the expected shape); tensor addresses are stable for the
// lifetime of the Weights; Update() validates before it changes anything. Tied embeddings: the
// LM head is the embedding tensor, and "lm_head.weight" is not listed.
// Thread safety: const methods may run concurrently; Update() needs exclusive access (the
// runner calls it on the engine thread between forwards).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_io/dtype.h"
#include "common/model_io/model_config.h"
#include "common/model_io/safetensors.h"
#include "services/worker/model/backend.h"
#include "services/worker/model/model_runner.h"

namespace rl::model {

struct WeightTensor {
  std::string name;
  model_io::DType dtype = model_io::DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // host memory, NumElements() · DTypeSize(dtype) bytes
  int64_t num_bytes = 0;
};

struct LayerWeights {
  const WeightTensor* input_norm = nullptr;  // [hidden]
  const WeightTensor* q_proj = nullptr;      // [num_heads · head_dim, hidden]
  const WeightTensor* k_proj = nullptr;      // [num_kv_heads · head_dim, hidden]
  const WeightTensor* v_proj = nullptr;      // [num_kv_heads · head_dim, hidden]
  const WeightTensor* q_bias = nullptr;      // [num_heads · head_dim] (attention_bias only)
  const WeightTensor* k_bias = nullptr;      // [num_kv_heads · head_dim]
  const WeightTensor* v_bias = nullptr;      // [num_kv_heads · head_dim]
  const WeightTensor* q_norm = nullptr;      // [head_dim] (qk_norm only)
  const WeightTensor* k_norm = nullptr;      // [head_dim]
  const WeightTensor* o_proj = nullptr;      // [hidden, num_heads · head_dim]
  const WeightTensor* post_norm = nullptr;   // [hidden]
  // Dense MLP (null in MoE layers).
  const WeightTensor* gate_proj = nullptr;  // [intermediate, hidden]
  const WeightTensor* up_proj = nullptr;    // [intermediate, hidden]
  const WeightTensor* down_proj = nullptr;  // [hidden, intermediate]
  // MoE layers (config.IsMoeLayer): the router ("mlp.gate") and num_experts experts, every
  // expert tensor in one dtype (checked at load; updates keep the held dtype).
  const WeightTensor* router = nullptr;          // [num_experts, hidden]
  std::vector<const WeightTensor*> expert_gate;  // [moe_intermediate, hidden] each
  std::vector<const WeightTensor*> expert_up;    // [moe_intermediate, hidden] each
  std::vector<const WeightTensor*> expert_down;  // [hidden, moe_intermediate] each
};

// One tensor in memory the caller gives away (a copy of the served weights a delta was applied
// to: weights/publication.h). Several tensors may share one `owner` (a pooled arena).
struct OwnedTensor {
  TensorInfo info;
  uint8_t* data = nullptr;            // NumElements · DTypeSize(info.dtype) bytes
  std::shared_ptr<const void> owner;  // keeps `data` alive
  int64_t num_bytes = 0;
};

class Weights {
 public:
  const model_io::ModelConfig& config() const { return config_; }
  const WeightTensor& embed() const { return *embed_; }
  const WeightTensor& lm_head() const { return *lm_head_; }
  const WeightTensor& final_norm() const { return *final_norm_; }
  const LayerWeights& layer(int64_t i) const { return layers_[static_cast<size_t>(i)]; }

  // Null when the model has no tensor of that name.
  const WeightTensor* Find(const std::string& name) const;
  // Every tensor, sorted by name.
  std::vector<TensorInfo> List() const;
  // Calls fn(info, bytes) per tensor in name order; bytes are valid during the call.
  void Visit(const std::function<void(const TensorInfo&, absl::Span<const uint8_t>)>& fn) const;
  // Total bytes of the tensors one forward token reads (all of them; the embedding row only
  // when the head is untied). Used for memory-bandwidth bounds.
  int64_t BytesPerToken() const;
  int64_t TotalBytes() const;
  // A number no other Weights object of this process has (never reused, unlike an address):
  // what a staged device copy names as its source (staged_mirror.h).
  uint64_t serial() const { return serial_; }
  // Reserves spare read buffers the size of this checkpoint's files (model_io/file_read.h), so
  // the next LoadWeights of the same layout reuses memory instead of faulting fresh pages in.
  void ReserveUpdateBuffers() const;

  // Replaces tensor `info.name` with `bytes` (info.dtype F32/BF16/F16, converted to the held
  // dtype). The shape must equal the held one. Nothing changes on error.
  absl::Status Update(const TensorInfo& info, absl::Span<const uint8_t> bytes);

 private:
  friend absl::StatusOr<std::unique_ptr<Weights>> LoadWeights(const std::string&,
                                                              const model_io::ModelConfig&);
  friend absl::StatusOr<std::unique_ptr<Weights>> WeightsFromCheckpoint(
      model_io::Checkpoint, const model_io::ModelConfig&);
  friend absl::StatusOr<std::unique_ptr<Weights>> WeightsFromOwnedTensors(
      std::vector<OwnedTensor>, const model_io::ModelConfig&);
  // Checks and indexes the tensors `find` gives against config_ (both loads above).
  static absl::StatusOr<std::unique_ptr<Weights>> Build(
      std::unique_ptr<Weights> w,
      const std::function<const model_io::TensorView*(const std::string&)>& find);
  friend absl::StatusOr<std::unique_ptr<Weights>> MirrorWeights(const Weights&, Backend*, bool,
                                                                bool);
  friend absl::Status RefreshMirror(const Weights&, const std::string&, Backend*, Weights*);
  friend absl::StatusOr<std::unique_ptr<Weights>> AllocateMirror(const Weights&, Backend*, bool,
                                                                 bool);
  friend absl::Status CopyMirror(const Weights&, Backend*, Weights*);
  friend absl::StatusOr<std::unique_ptr<Weights>> MirrorImpl(const Weights&, Backend*, bool, bool,
                                                             bool);
  Weights();

  uint64_t serial_;

  model_io::ModelConfig config_;
  model_io::Checkpoint checkpoint_;  // owns the tensor bytes read from disk
  std::map<std::string, WeightTensor> tensors_;
  std::map<std::string, std::unique_ptr<uint8_t[]>> owned_;  // copies (updates, realigned)
  std::vector<std::shared_ptr<const void>> arenas_;          // what OwnedTensors' bytes live in
  const WeightTensor* embed_ = nullptr;
  const WeightTensor* lm_head_ = nullptr;
  const WeightTensor* final_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  // Mirrors only: the backend memory behind every tensor, and the FP32 copies (of a 16-bit LM
  // head, of 16-bit MoE routers), by source tensor name.
  struct F32Copy {
    std::unique_ptr<WeightTensor> tensor;
    DeviceBuffer buffer;
  };
  std::vector<DeviceBuffer> device_buffers_;
  std::map<std::string, F32Copy> f32_copies_;
};

// Opens DIR's safetensors checkpoint (single file or sharded) and checks it against `config`.
absl::StatusOr<std::unique_ptr<Weights>> LoadWeights(const std::string& model_dir,
                                                     const model_io::ModelConfig& config);
absl::StatusOr<std::unique_ptr<Weights>> WeightsFromCheckpoint(model_io::Checkpoint checkpoint,
                                                               const model_io::ModelConfig& config);
// Weights over `tensors` (taken), with the checks of a checkpoint load (every tensor the
// architecture needs, shapes, dtypes); tensors it does not use are dropped.
absl::StatusOr<std::unique_ptr<Weights>> WeightsFromOwnedTensors(
    std::vector<OwnedTensor> tensors, const model_io::ModelConfig& config);

// A copy of `host` in `backend` memory (tensor data are device pointers; names, dtypes and
// shapes are the host's), for device backends. With `fp32_lm_head` and a 16-bit LM head, the
// head is held as an extra F32 copy (not listed) so the logits GEMM runs in float32; likewise
// every 16-bit MoE router with `fp32_router` (--enable-fp32-router). The backend must outlive
// the mirror. Costs one allocation and one copy per tensor.
absl::StatusOr<std::unique_ptr<Weights>> MirrorWeights(const Weights& host, Backend* backend,
                                                       bool fp32_lm_head, bool fp32_router = false);
// MirrorWeights without the copies: the device memory of a mirror of `host`, uninitialised,
// filled tensor by tensor with RefreshMirror (a staged device copy, staged_mirror.h).
absl::StatusOr<std::unique_ptr<Weights>> AllocateMirror(const Weights& host, Backend* backend,
                                                        bool fp32_lm_head, bool fp32_router);
// Copies every tensor (and FP32 copy) of mirror `from` into mirror `to` of the same
// architecture and options, on the device (Backend::CopyOnDevice); `to`'s pointers do not change.
absl::Status CopyMirror(const Weights& from, Backend* backend, Weights* to);
// Copies tensor `name` of `host` (every tensor when empty) into `mirror`, which must have been
// made from weights of the same architecture; the FP32 copies follow their sources. Used after
// an update has been validated on the host, so it fails only on a device error.
absl::Status RefreshMirror(const Weights& host, const std::string& name, Backend* backend,
                           Weights* mirror);
// OK when `a` and `b` describe the same architecture (every shape-determining field).
absl::Status CheckSameArchitecture(const model_io::ModelConfig& a, const model_io::ModelConfig& b);

}  // namespace rl::model
