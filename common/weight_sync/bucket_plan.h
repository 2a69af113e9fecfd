// Bucketing a checkpoint for a distributed weight update: the trainer broadcasts one bucket
// per UpdateWeightsFromDistributed call, and the bucket's JSON line is the metadata that call
// carries (names, dtypes, shapes). A library of its own (rl_bucket_plan) so the worker's
// transports, rl-weight-sender and rlctl share it without linking any transport or server.
//
// Plan: greedy in the given order (a Checkpoint's is by name); a bucket closes when the next
// tensor would push it past `bucket_bytes`; a tensor larger than `bucket_bytes` travels alone.
// Every tensor lands in exactly one bucket, none is empty. O(number of tensors); the data
// spans point into the caller's tensors (no copy) and live as long as they do.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_io/safetensors.h"
#include "common/weight_sync/tensor_spec.h"

namespace rl::weight_sync {

struct Bucket {
  std::vector<TensorSpec> specs;                // as they travel (the bucket header)
  std::vector<absl::Span<const uint8_t>> data;  // data[i] holds specs[i]'s bytes
  int64_t bytes = 0;
  // A delta receive's bucket (issue 30; docs/weight-sync.md): per tensor the spec the request
  // lists (its own dtype and shape), its encoding ("dense", "overwrite", "xor") and count; an
  // encoded tensor travels as U8[payload bytes] in `specs`. Empty: every tensor whole.
  std::vector<TensorSpec> listed;
  std::vector<std::string> encodings;
  std::vector<int64_t> delta_counts;
};

// What a bucket line carries for the receive call: the tensors as listed and, for a delta
// receive, their encodings, counts and payload bytes (all empty for a dense bucket), and the
// parent version the line names (-1: none).
struct BucketLine {
  std::vector<TensorSpec> specs;
  std::vector<std::string> encodings;
  std::vector<int64_t> delta_counts;
  std::vector<int64_t> payload_bytes;
  int64_t parent_version = -1;
};

// INVALID_ARGUMENT for bucket_bytes <= 0 or a tensor whose dtype is not F32 / BF16 / F16.
absl::StatusOr<std::vector<Bucket>> PlanBuckets(const std::vector<model_io::TensorView>& tensors,
                                                int64_t bucket_bytes);
absl::StatusOr<std::vector<Bucket>> PlanBuckets(const model_io::Checkpoint& checkpoint,
                                                int64_t bucket_bytes);

// One line of JSON (no newline): {"bucket": i, "num_buckets": n, "bytes": b, "last": bool,
// "names": [...], "dtypes": [...], "shapes": [[...], ...]}; a delta bucket lists its tensors as
// `listed` and adds "encodings", "delta_counts", "payload_bytes" and, when `parent_version` >= 0,
// "parent_version".
std::string BucketJson(const Bucket& bucket, size_t index, size_t num_buckets,
                       int64_t parent_version = -1);

// The specs of a BucketJson line; INVALID_ARGUMENT when it is not one.
absl::StatusOr<std::vector<TensorSpec>> ParseBucketJson(const std::string& line);
// The whole of a BucketJson line (a delta bucket's encodings too); INVALID_ARGUMENT naming the
// field when it is not one (the encoding lists must have one entry per name).
absl::StatusOr<BucketLine> ParseBucketLine(const std::string& line);

}  // namespace rl::weight_sync
