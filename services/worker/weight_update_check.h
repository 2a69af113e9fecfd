// Weight-update validation: everything an UpdateWeightsFromDisk / UpdateWeightsFromTensor call
// names is checked before the served weights (or big buffers) are touched.
//
// Disk: the path is bounded, a folder, and its config.json (read as a bounded regular file,
// JSON depth checked) describes the served architecture (class name, every shape-determining
// field, vocabulary size); the checkpoint itself is validated by model_io and
// model::WeightsFromCheckpoint before the atomic swap.
// Tensor: each chunk header is bounded (model_io limits in common/request_limits.h), names a
// served weight with its exact shape, and the stream's bytes stay under --max-update-bytes:
// nothing is allocated for a tensor before its header passed.
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

namespace rl::worker {

// Name → shape of every served weight (fixed for the life of the process: updates never change
// the architecture).
using WeightShapes = std::map<std::string, std::vector<int64_t>>;

// Validates an UpdateWeightsFromDisk folder against the served model (see the file comment).
absl::Status CheckDiskUpdate(const std::string& model_path, const model_io::ModelConfig& served,
                             const RequestLimits& limits);

// Validates one chunk header against the served weights; on success `*tensor_bytes` is the
// whole tensor's byte size in the chunk's dtype.
absl::Status CheckChunkForModel(const rl::v1::TensorChunk& chunk, const WeightShapes& shapes,
                                const RequestLimits& limits, int64_t* tensor_bytes);

}  // namespace rl::worker
