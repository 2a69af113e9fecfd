// Weight-update validation: everything an update names is checked before the served weights
// (or big buffers) are touched, so a refused update changes nothing.
//
// Disk: the path is bounded, a folder, and its config.json (a bounded regular file, JSON depth
// checked) describes the served architecture; the checkpoint itself is validated by model_io
// and model::WeightsFromCheckpoint before the atomic swap. Tensor stream: each chunk header is
// bounded (common/request_limits.h) and names a served weight with its exact shape, before
// anything is allocated for it. Tensor lists (staged tensors, distributed buckets): known
// names, no repeats, the served shapes, a float dtype and the right byte count.
// Cost: a stat and a small file read per disk update; O(tensors) map lookups per list.
// Thread-safe (pure functions over immutable inputs).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model_io/model_config.h"
#include "common/request_limits.h"
#include "rl/v1/admin.pb.h"
#include "services/worker/model/model_runner.h"
#include "services/worker/weights/weight_updates.h"

namespace rl::worker {

// Validates an UpdateWeightsFromDisk folder against the served model (see the file comment).
absl::Status CheckDiskUpdate(const std::string& model_path, const model_io::ModelConfig& served,
                             const RequestLimits& limits);

// Validates one chunk header against the served weights; on success `*tensor_bytes` is the
// whole tensor's byte size in the chunk's dtype.
absl::Status CheckChunkForModel(const rl::v1::TensorChunk& chunk, const WeightShapes& shapes,
                                const RequestLimits& limits, int64_t* tensor_bytes);

// One encoded tensor of a delta receive against its (validated) tensor: a float dtype, the count
// within its elements and the payload within the largest encoding of that count
// (weight_sync::MaxDeltaPayloadBytes) and --max-update-bytes. INVALID_ARGUMENT naming it.
absl::Status CheckEncodedTensor(const model::TensorInfo& tensor, const EncodedTensor& encoded,
                                const RequestLimits& limits);

// Checks that every tensor of `incoming` names a weight of `served` with the same shape, a float
// dtype (F32, BF16, F16) and, where `byte_counts[i]` >= 0, that many bytes; and that no name
// repeats. INVALID_ARGUMENT naming the first bad tensor.
absl::Status ValidateTensors(const std::vector<model::TensorInfo>& served,
                             const std::vector<const model::TensorInfo*>& incoming,
                             const std::vector<int64_t>& byte_counts);

}  // namespace rl::worker
