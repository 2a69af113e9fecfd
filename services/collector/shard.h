// Shard files: a batch of samples as one safetensors file of ragged (CSR) columns.
//
// Tensors (all samples' tokens concatenated; sample i owns [offsets[i], offsets[i+1])):
//   offsets           I64 [N+1]   offsets[0] = 0, non-decreasing, offsets[N] = T
//   tokens            I32 [T]     prompt tokens then response tokens
//   loss_mask         U8  [T]     0 prompt, 1 response
//   rollout_logprobs  F32 [T]     NaN for prompt tokens
//   weight_versions   I64 [T]     -1 for prompt tokens
// Header __metadata__ (string values): "format" = kShardFormat, "num_samples", and one JSON
// array of N entries per scalar column: index, sample, group, status, finish_reason, prompt_len,
// attempts, weight_version, metadata (the prompt rows' extra fields, objects).
// R3 (only when some sample carries routed experts, rl-collect --return-routed-experts):
//   routed_offsets    I64 [N+1]   sample i owns routed_experts[routed_offsets[i] ...]
//   routed_experts    I32 [R]     row-major [tokens, MoE layers, top_k] per sample
//   expert_weights    F32 [R]     their routing weights (NaN where a sample has none), or [0]
// with metadata arrays routed_start (first token position) and routed_shape ([tokens, layers,
// top_k], [] for a sample without routing).
// The same layout serves the shards and the merged trajectories.safetensors. Encoding is
// deterministic: equal records give equal bytes.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/collector/sample.h"

namespace rl::collector {

inline constexpr char kShardFormat[] = "rlfleet.trajectories.v1";

// Bytes of a safetensors file holding `records` in the given order.
std::string EncodeShard(const std::vector<SampleRecord>& records);
// Parses and validates a shard; `source` names it in errors (DataLoss / InvalidArgument).
absl::StatusOr<std::vector<SampleRecord>> DecodeShard(const std::string& bytes,
                                                      const std::string& source);
// One JSON object per line per record (tokens, mask, logprobs, versions, text, scalars), for
// debugging.
std::string EncodeJsonl(const std::vector<SampleRecord>& records);

}  // namespace rl::collector
