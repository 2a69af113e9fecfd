// RopeTable: RoPE inverse frequencies for a config (rope_theta plus linear, dynamic-NTK or
// Llama-3 scaling, computed as Hugging Face transformers does) and the per-token cos/sin rows
// the rope kernel consumes.
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

 private:
  static std::vector<float> BaseInvFreq(double theta, int64_t head_dim);

  model_io::ModelConfig config_;
  std::vector<float> inv_freq_;  // static part (all but dynamic)
};

}  // namespace rl::model
