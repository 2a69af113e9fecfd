#include "services/worker/model/rope_table.h"

#include <sleef.h>

#include <algorithm>
#include <cmath>

namespace rl::model {

using model_io::RopeScaling;

namespace {

// pow of two float32 tensors as torch computes it on the CPU: SLEEF's powf with 1.0-ulp
// accuracy (torch's vectorized pow), which is not always the correctly rounded result.
float PowF(float base, float exponent) { return Sleef_powf_u10(base, exponent); }

}  // namespace

std::vector<float> RopeTable::BaseInvFreq(float base, int64_t head_dim) {
  // transformers: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), every op in float32:
  // the exponent is a float division, the power is rounded to float, then a float reciprocal.
  std::vector<float> f(static_cast<size_t>(head_dim / 2));
  const float dim = static_cast<float>(head_dim);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / dim;
    f[static_cast<size_t>(i)] = 1.0f / PowF(base, exponent);
  }
  return f;
}

RopeTable::RopeTable(const model_io::ModelConfig& config) : config_(config) {
  inv_freq_ = BaseInvFreq(static_cast<float>(config.rope_theta), config.head_dim);
  const RopeScaling& rs = config.rope_scaling;
  if (rs.type == RopeScaling::Type::kLinear) {
    // inv_freq /= factor (float32).
    const float factor = static_cast<float>(rs.factor);
    for (float& f : inv_freq_) f = f / factor;
  } else if (rs.type == RopeScaling::Type::kLlama3) {
    // transformers' _compute_llama3_parameters on float32 tensors: Python scalars take part
    // as float32 values, comparisons included.
    const float factor = static_cast<float>(rs.factor);
    const float low = static_cast<float>(rs.low_freq_factor);
    const double old_len_d = static_cast<double>(rs.original_max_position_embeddings);
    const float old_len = static_cast<float>(old_len_d);
    const float low_wavelen = static_cast<float>(old_len_d / rs.low_freq_factor);
    const float high_wavelen = static_cast<float>(old_len_d / rs.high_freq_factor);
    const float two_pi = static_cast<float>(2.0 * M_PI);
    const float band = static_cast<float>(rs.high_freq_factor - rs.low_freq_factor);
    for (float& f : inv_freq_) {
      const float wavelen = two_pi / f;
      float scaled = wavelen > low_wavelen ? f / factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const float smooth = (old_len / wavelen - low) / band;
        scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
      }
      f = scaled;
    }
  }
}

std::vector<float> RopeTable::InvFreq(int64_t seq_len) const {
  const RopeScaling& rs = config_.rope_scaling;
  if (rs.type != RopeScaling::Type::kDynamic) return inv_freq_;
  const int64_t orig = rs.original_max_position_embeddings > 0 ? rs.original_max_position_embeddings
                                                               : config_.max_position_embeddings;
  if (seq_len <= orig) return inv_freq_;
  // transformers' dynamic update passes seq_len as an int64 tensor, so the base is computed in
  // float32: base * ((factor * seq_len / orig) - (factor - 1)) ** (dim / (dim - 2)).
  const double dim = static_cast<double>(config_.head_dim);
  const float factor = static_cast<float>(rs.factor);
  const float ratio = factor * static_cast<float>(seq_len) / static_cast<float>(orig) -
                      static_cast<float>(rs.factor - 1.0);
  // tensor ** Python float: the float base raised to the double exponent, rounded once.
  const float scale = static_cast<float>(std::pow(static_cast<double>(ratio), dim / (dim - 2.0)));
  const float base = static_cast<float>(config_.rope_theta) * scale;
  return BaseInvFreq(base, config_.head_dim);
}

void RopeTable::Fill(int64_t position, int64_t seq_len, float* cos, float* sin) const {
  const std::vector<float> dynamic = config_.rope_scaling.type == RopeScaling::Type::kDynamic
                                         ? InvFreq(seq_len)
                                         : std::vector<float>();
  const std::vector<float>& f = dynamic.empty() ? inv_freq_ : dynamic;
  const float pos = static_cast<float>(position);
  for (size_t i = 0; i < f.size(); ++i) {
    const float angle = pos * f[i];  // float32 product, as transformers
    cos[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
    sin[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
  }
}

}  // namespace rl::model
