// One collected sample (a prompt row × one of its n completions) and its conversion from the
// router's GenerateFinal.
//
// Per-token columns all have prompt_len + response length entries: tokens, loss_mask (0 for
// prompt, 1 for response), rollout_logprobs (NaN for prompt tokens) and weight_versions (-1 for
// prompt tokens; for response tokens the version that generated each token, expanded from the
// final's run-length `weight_version_segments`, or `weight_version` for every token when an
// older worker sent no segments). A failed sample has no tokens and a non-"ok" status.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rl/v1/generate.pb.h"

namespace rl::collector {

// Identity of a sample: the prompt row's index and the completion number in [0, n).
struct SampleKey {
  int64_t index = 0;
  int32_t sample = 0;
  friend bool operator<(const SampleKey& a, const SampleKey& b) {
    return a.index != b.index ? a.index < b.index : a.sample < b.sample;
  }
  friend bool operator==(const SampleKey& a, const SampleKey& b) {
    return a.index == b.index && a.sample == b.sample;
  }
  template <typename H>
  friend H AbslHashValue(H h, const SampleKey& k) {
    return H::combine(std::move(h), k.index, k.sample);
  }
};

struct SampleRecord {
  SampleKey key;
  int64_t group = 0;          // one id per prompt row (its position in the prompt file)
  std::string status = "ok";  // "ok", or "CODE: message" for a sample that finally failed
  std::string finish_reason;  // "stop", "length", "abort" or "" (failed)
  int32_t prompt_len = 0;
  int32_t attempts = 0;              // collector attempts (each may include router retries)
  int64_t weight_version = 0;        // version of the last token
  std::string metadata_json = "{}";  // the row's extra fields, carried through
  std::string text;                  // completion text (JSONL twin only)
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;
  std::vector<float> rollout_logprobs;
  std::vector<int64_t> weight_versions;
  // R3 (MoE, when asked for): the final's routed experts, row-major [tokens, layers, top_k]
  // (routed_shape) for the tokens from position routed_start on, and their weights (same
  // shape, or empty). Empty shape: none.
  std::vector<int32_t> routed_shape;
  int32_t routed_start = 0;
  std::vector<int32_t> routed_experts;
  std::vector<float> expert_weights;

  bool ok() const { return status == "ok"; }
};

// Per-output-token weight versions of `final`: its segments expanded (they must add up to the
// number of output tokens, else InvalidArgument), or `weight_version` repeated when it carries
// none.
absl::StatusOr<std::vector<int64_t>> ExpandWeightVersions(const rl::v1::GenerateFinal& final);

// Fills the token columns of `record` from a router final requested with return_logprob and
// return_trajectory (and its R3 arrays when the final has them, checked against their shape).
// The prompt tokens are the trajectory's tokens before the output.
absl::Status FillFromFinal(const rl::v1::GenerateFinal& final, SampleRecord* record);

const char* FinishReasonName(rl::v1::FinishReason reason);

}  // namespace rl::collector
