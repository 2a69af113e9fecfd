// RopeTable: RoPE inverse frequencies for a config (rope_theta plus linear, dynamic-NTK or
// Llama-3 scaling) and the per-token cos/sin rows the rope kernel consumes.
//
// The frequencies are computed exactly as Hugging Face transformers computes them on float32
// tensors: the exponent 2i/dim as a float division, pow(theta, e) rounded to float, a float
// reciprocal, and the scaling (linear division, Llama-3 smoothing, dynamic-NTK base) in float32
// ops with the config's scalars rounded to float. Computing in double and rounding once differs
// by 1-4 ulp in many frequencies, an angle error that grows linearly with the position.
// tests/worker/model/rope_table_test.cc checks every scaling type bit for bit against tables
// produced by transformers (tests/golden/model/rope_inv_freq.json).
//
// Dynamic NTK rescales the base from the sequence's length; the runner uses each sequence's own
// length (start_pos + tokens this step), so a token's rotation never depends on the batch.
// Cost: head_dim/2 cos+sin per token; the static frequencies are computed once.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model_io/model_config.h"

namespace rl::model {

class RopeTable {
 public:
  explicit RopeTable(const model_io::ModelConfig& config);

  int64_t half_dim() const { return static_cast<int64_t>(inv_freq_.size()); }
  // Inverse frequencies used for a sequence of total length `seq_len`.
  std::vector<float> InvFreq(int64_t seq_len) const;
  // Writes cos/sin rows [half_dim] for `position` of a sequence of total length `seq_len`.
  void Fill(int64_t position, int64_t seq_len, float* cos, float* sin) const;

  // Public for tests: the default (unscaled) frequencies for a float32 base.
  static std::vector<float> BaseInvFreq(float base, int64_t head_dim);

 private:
  model_io::ModelConfig config_;
  std::vector<float> inv_freq_;  // static part (all but dynamic)
};

}  // namespace rl::model
