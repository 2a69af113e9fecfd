// TensorSpec: one tensor of a weight-sync bucket as the worker's UpdateWeightsFromDistributed
// metadata names it (name, safetensors dtype, shape), and its byte size. Shared by the worker's
// weight-sync transports, the trainer-side sender and rlctl; pure value code, no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rl::weight_sync {

struct TensorSpec {
  std::string name;
  // "F32" | "BF16" | "F16" (safetensors spelling); "U8" for raw bytes (a delta receive carries
  // each encoded tensor's payload as U8[payload_bytes], issue 30).
  std::string dtype;
  std::vector<int64_t> shape;
};

// numel × dtype size. InvalidArgument for an unknown dtype or one other than F32, BF16, F16,
// U8, a negative dimension or a size that overflows int64.
absl::StatusOr<int64_t> TensorBytes(const TensorSpec& spec);

// "name BF16[4096, 128]" for messages.
std::string DescribeSpec(const TensorSpec& spec);

}  // namespace rl::weight_sync
