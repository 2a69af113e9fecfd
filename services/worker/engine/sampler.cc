#include "services/worker/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/status.h"
#include "kernels/cpu/vec_ops.h"

namespace rl::engine {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

double CounterUniform(uint64_t seed, uint64_t step) {
  const uint64_t h = SplitMix64(SplitMix64(seed) ^ (step * 0xd1b54a32d192ed03ULL + 1));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

uint64_t DeriveSeed(uint64_t seed, int32_t index) {
  return index == 0 ? seed : SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(index)));
}

double LogprobTemperature(const Sequence& seq) {
  const double t = seq.params().temperature;
  return (t == 0.0 || seq.request().logprobs_at_temperature_one) ? 1.0 : t;
}

absl::Status Sampler::CheckShape(const ScheduledBatch& batch,
                                 const model::ForwardOutput& out) const {
  const int64_t vocab = options_.vocab_size;
  const size_t n = batch.entries.size();
  bool shape_ok = out.vocab_size == vocab && out.row_begin.size() == n + 1 &&
                  out.row_begin[0] == 0 &&
                  static_cast<int64_t>(out.logits.size()) == out.row_begin[n] * vocab;
  for (size_t i = 0; shape_ok && i < n; ++i) {
    const int64_t rows = out.row_begin[i + 1] - out.row_begin[i];
    const BatchEntry& e = batch.entries[i];
    const int64_t expected = e.logits == model::LogitsMode::kAll    ? e.count
                             : e.logits == model::LogitsMode::kLast ? 1
                                                                    : 0;
    shape_ok = rows == expected;
  }
  if (!shape_ok) return absl::InternalError("model runner returned logits of the wrong shape");
  return absl::OkStatus();
}

absl::Status Sampler::Sample(const ScheduledBatch& batch, model::ForwardOutput* out,
                             SampledBatch* sampled) {
  RETURN_IF_ERROR(CheckShape(batch, *out));
  const int64_t vocab = options_.vocab_size;
  sampled->entries.clear();
  sampled->entries.resize(batch.entries.size());
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    const int64_t begin = out->row_begin[i];
    SampleEntry(batch.entries[i], out->logits.data() + begin * vocab, out->row_begin[i + 1] - begin,
                &sampled->entries[i]);
  }
  sampled->routed_experts.swap(out->routed_experts);
  sampled->routed_weights.swap(out->routed_weights);
  return absl::OkStatus();
}

void Sampler::SampleEntry(const BatchEntry& entry, const float* rows, int64_t num_rows,
                          SampledEntry* result) {
  const Sequence& seq = *entry.seq;
  const GenerateRequest& r = seq.request();
  const SamplingParams& p = seq.params();
  const int64_t vocab = options_.vocab_size;
  if (!seq.prompt_logprobs_done && entry.logits == model::LogitsMode::kAll) {
    const int64_t first = std::max(r.logprob_start_len, 1);
    for (int64_t i = 0; i < num_rows; ++i) {
      const int64_t target = entry.start + i + 1;
      if (target < first || target >= seq.prompt_len) continue;
      result->prompt_logprobs.push_back(Logprob(rows + i * vocab, vocab, LogprobTemperature(seq),
                                                seq.tokens[target], r.top_logprobs_num));
    }
  }
  const bool prefill_left = entry.start + entry.count < static_cast<int64_t>(seq.tokens.size());
  if (prefill_left || seq.output_len() >= p.max_new_tokens || num_rows == 0) return;
  const float* last = rows + (num_rows - 1) * vocab;
  banned_.clear();
  if (seq.output_len() < p.min_new_tokens) {
    if (!p.ignore_eos) banned_ = options_.eos_token_ids;
    banned_.insert(banned_.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  }
  SampleInput in;
  in.logits = last;
  in.vocab = vocab;
  in.params = &p;
  in.all_tokens = seq.tokens;
  in.output_counts = &seq.output_counts;
  in.banned = banned_;
  in.seed = seq.seed;
  in.step = seq.output_len();
  result->token = Sample(in);
  if (r.return_logprob) {
    result->logprob =
        Logprob(last, vocab, LogprobTemperature(seq), result->token, r.top_logprobs_num);
  }
}

int32_t Sampler::Sample(const SampleInput& in) {
  const SamplingParams& p = *in.params;
  const int64_t vocab = in.vocab;
  z_.resize(vocab);
  for (int64_t i = 0; i < vocab; ++i) z_[i] = in.logits[i];

  if (p.repetition_penalty != 1.0) {
    seen_.assign(vocab, 0);
    for (int32_t t : in.all_tokens) {
      if (seen_[t]) continue;
      seen_[t] = 1;
      z_[t] = z_[t] > 0 ? z_[t] / p.repetition_penalty : z_[t] * p.repetition_penalty;
    }
  }
  if ((p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) && in.output_counts != nullptr) {
    for (const auto& [token, count] : *in.output_counts) {
      z_[token] -= p.frequency_penalty * count + p.presence_penalty;
    }
  }
  for (int32_t t : in.banned) z_[t] = kNegInf;

  // Argmax with ties to the lowest id; also the fallback when everything is masked.
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (z_[i] > z_[best]) best = i;
  }
  if (p.temperature == 0.0 || z_[best] == kNegInf) return static_cast<int32_t>(best);

  const double inv_t = 1.0 / p.temperature;
  const double zmax = z_[best];
  // Unnormalized probabilities: e^((z - zmax) / T), 0 for a masked token.
  kernels::cpu::ExpShiftScale(z_.data(), z_.data(), vocab, zmax, inv_t);
  const double u = CounterUniform(in.seed, static_cast<uint64_t>(in.step));
  const bool top_k_on = p.top_k > 0 && p.top_k < vocab;
  if (!top_k_on && p.top_p >= 1.0 && p.min_p <= 0.0) {
    double total = 0;
    for (int64_t i = 0; i < vocab; ++i) total += z_[i];
    double target = u * total, acc = 0;
    int64_t last_nonzero = best;
    for (int64_t i = 0; i < vocab; ++i) {
      if (z_[i] == 0.0) continue;
      acc += z_[i];
      last_nonzero = i;
      if (acc > target) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(last_nonzero);
  }

  order_.resize(vocab);
  for (int64_t i = 0; i < vocab; ++i) order_[i] = static_cast<int32_t>(i);
  auto more_likely = [this](int32_t a, int32_t b) {
    return z_[a] != z_[b] ? z_[a] > z_[b] : a < b;
  };
  int64_t num = vocab;
  if (top_k_on) {
    num = p.top_k;
    std::nth_element(order_.begin(), order_.begin() + num - 1, order_.end(), more_likely);
  }
  std::sort(order_.begin(), order_.begin() + num, more_likely);
  while (num > 1 && z_[order_[num - 1]] == 0.0) --num;

  double total = 0;
  for (int64_t i = 0; i < num; ++i) total += z_[order_[i]];
  if (p.top_p < 1.0) {
    double acc = 0;
    int64_t keep = 0;
    while (keep < num) {
      acc += z_[order_[keep]];
      ++keep;
      if (acc >= p.top_p * total) break;
    }
    num = keep;
  }
  if (p.min_p > 0.0) {
    const double threshold = p.min_p * z_[order_[0]];
    int64_t keep = 1;
    while (keep < num && z_[order_[keep]] >= threshold) ++keep;
    num = keep;
  }
  total = 0;
  for (int64_t i = 0; i < num; ++i) total += z_[order_[i]];
  const double target = u * total;
  double acc = 0;
  for (int64_t i = 0; i < num; ++i) {
    acc += z_[order_[i]];
    if (acc > target) return order_[i];
  }
  return order_[num - 1];
}

TokenLogprob Sampler::Logprob(const float* logits, int64_t vocab, double temperature, int32_t token,
                              int32_t top_n) {
  const double inv_t = 1.0 / temperature;
  double zmax = kNegInf;
  for (int64_t i = 0; i < vocab; ++i) zmax = std::max(zmax, logits[i] * inv_t);
  const double log_z = zmax + std::log(kernels::cpu::SumExpScaled(logits, vocab, inv_t, zmax));
  TokenLogprob out;
  out.token_id = token;
  out.logprob = logits[token] * inv_t - log_z;
  if (top_n > 0) {
    const int64_t n = std::min<int64_t>(top_n, vocab);
    order_.resize(vocab);
    for (int64_t i = 0; i < vocab; ++i) order_[i] = static_cast<int32_t>(i);
    auto more_likely = [logits](int32_t a, int32_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    };
    std::partial_sort(order_.begin(), order_.begin() + n, order_.end(), more_likely);
    out.top.reserve(n);
    for (int64_t i = 0; i < n; ++i) {
      out.top.push_back({order_[i], logits[order_[i]] * inv_t - log_z});
    }
  }
  return out;
}

}  // namespace rl::engine
