#include "services/worker/model/rope_table.h"

#include <algorithm>
#include <cmath>

namespace rl::model {

using model_io::RopeScaling;

std::vector<float> RopeTable::BaseInvFreq(double theta, int64_t head_dim) {
  // As transformers: 1 / base ** (arange(0, dim, 2) / dim) in float32.
  std::vector<float> f(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    f[static_cast<size_t>(i)] =
        static_cast<float>(1.0 / std::pow(theta, static_cast<double>(exponent)));
  }
  return f;
}

RopeTable::RopeTable(const model_io::ModelConfig& config) : config_(config) {
  inv_freq_ = BaseInvFreq(config.rope_theta, config.head_dim);
  const RopeScaling& rs = config.rope_scaling;
  if (rs.type == RopeScaling::Type::kLinear) {
    for (float& f : inv_freq_) f = static_cast<float>(f / rs.factor);
  } else if (rs.type == RopeScaling::Type::kLlama3) {
    const double old_len = static_cast<double>(rs.original_max_position_embeddings);
    const double low_wavelen = old_len / rs.low_freq_factor;
    const double high_wavelen = old_len / rs.high_freq_factor;
    for (float& f : inv_freq_) {
      const double freq = f;
      const double wavelen = 2.0 * M_PI / freq;
      double scaled = wavelen > low_wavelen ? freq / rs.factor : freq;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const double smooth =
            (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        scaled = (1.0 - smooth) * scaled / rs.factor + smooth * scaled;
      }
      f = static_cast<float>(scaled);
    }
  }
}

std::vector<float> RopeTable::InvFreq(int64_t seq_len) const {
  const RopeScaling& rs = config_.rope_scaling;
  if (rs.type != RopeScaling::Type::kDynamic) return inv_freq_;
  const int64_t orig = rs.original_max_position_embeddings > 0
                           ? rs.original_max_position_embeddings
                           : config_.max_position_embeddings;
  if (seq_len <= orig) return inv_freq_;
  const double dim = static_cast<double>(config_.head_dim);
  const double base =
      config_.rope_theta *
      std::pow(rs.factor * static_cast<double>(seq_len) / static_cast<double>(orig) -
                   (rs.factor - 1.0),
               dim / (dim - 2.0));
  return BaseInvFreq(base, config_.head_dim);
}

void RopeTable::Fill(int64_t position, int64_t seq_len, float* cos, float* sin) const {
  const std::vector<float> dynamic =
      config_.rope_scaling.type == RopeScaling::Type::kDynamic ? InvFreq(seq_len)
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
