// FakeRunner: a deterministic ModelRunner for engine tests that behaves like a model with a
// KV cache. Every slot stores (position, hash of the whole token history up to it); Forward
// reads the history of earlier positions *through the kv_slots it is given* and derives the
// logits from that hash. So a scheduler that points a sequence at a freed, reused or wrong
// slot gets different logits (or an error for a slot holding another position) and the
// tokens diverge from ReferenceGreedy(), which computes the same chain without any KV.
//
// Tests can gate it: with SetStepBudget(k), Forward blocks after k more calls until
// AllowSteps() adds more, so a test can hold the engine between known steps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/model_io/model_config.h"
#include "services/worker/model/model_runner.h"

namespace rl::engine::testing {

struct FakeRunnerOptions {
  int64_t vocab_size = 64;
  int64_t num_kv_slots = 8192;
  int32_t page_size = 1;
  int64_t max_position_embeddings = 2048;
  std::vector<int32_t> eos_token_ids = {2};
  // Added to the EOS logits; very negative keeps EOS out of greedy outputs.
  double eos_bias = -100.0;
};

inline uint64_t FakeMix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of the history ending with `token` at position `pos`, given the previous hash.
inline uint64_t FakeChain(uint64_t prev, int32_t token, int64_t pos) {
  return FakeMix(FakeMix(prev, static_cast<uint64_t>(token)), static_cast<uint64_t>(pos));
}

inline void FakeLogits(uint64_t h, const FakeRunnerOptions& o, float* out) {
  for (int64_t v = 0; v < o.vocab_size; ++v) {
    const uint64_t r = FakeMix(h, static_cast<uint64_t>(v) + 1);
    out[v] = static_cast<float>(static_cast<double>(r >> 11) * 0x1.0p-53 * 8.0 - 4.0);
  }
  for (int32_t e : o.eos_token_ids) out[e] += static_cast<float>(o.eos_bias);
}

class FakeRunner : public model::ModelRunner {
 public:
  explicit FakeRunner(FakeRunnerOptions o = {}) : o_(o), kv_(o.num_kv_slots) {
    config_.architecture_name = "FakeForCausalLM";
    config_.model_type = "fake";
    config_.vocab_size = o.vocab_size;
    config_.max_position_embeddings = o.max_position_embeddings;
    config_.eos_token_ids = o.eos_token_ids;
  }

  const model_io::ModelConfig& config() const override { return config_; }
  std::string backend_name() const override { return "fake"; }
  int64_t num_kv_slots() const override { return o_.num_kv_slots; }
  int32_t page_size() const override { return o_.page_size; }

  absl::Status Forward(const model::ForwardInput& in, model::ForwardOutput* out) override {
    {
      absl::MutexLock lock(&mu_);
      while (budget_ == 0) cv_.Wait(&mu_);
      if (budget_ > 0) --budget_;
      if (fail_next_) {
        fail_next_ = false;
        ++steps_done_;
        cv_.SignalAll();
        return absl::InternalError("injected forward failure");
      }
    }
    out->vocab_size = o_.vocab_size;
    out->logits.clear();
    out->row_begin.assign(1, 0);
    int64_t tokens = 0;
    for (const model::SequenceInput& s : in.seqs) {
      const int64_t end = s.start_pos + static_cast<int64_t>(s.token_ids.size());
      if (static_cast<int64_t>(s.kv_slots.size()) != end) {
        return absl::InvalidArgumentError("kv_slots size != start_pos + tokens");
      }
      if (end > o_.max_position_embeddings) return absl::InvalidArgumentError("past context");
      for (int32_t slot : s.kv_slots) {
        if (slot < 0 || slot >= o_.num_kv_slots) {
          return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " out of range"));
        }
      }
      uint64_t h = 0;
      if (s.start_pos > 0) {
        for (int64_t p = 0; p < s.start_pos; ++p) {
          const Slot& slot = kv_[s.kv_slots[p]];
          if (slot.pos != p) {
            return absl::InternalError(absl::StrCat("slot ", s.kv_slots[p], " holds position ",
                                                    slot.pos, ", read as ", p));
          }
        }
        h = kv_[s.kv_slots[s.start_pos - 1]].hash;
      }
      for (size_t i = 0; i < s.token_ids.size(); ++i) {
        const int64_t pos = s.start_pos + static_cast<int64_t>(i);
        h = FakeChain(h, s.token_ids[i], pos);
        kv_[s.kv_slots[pos]] = Slot{pos, h};
        const bool want = s.logits == model::LogitsMode::kAll ||
                          (s.logits == model::LogitsMode::kLast && i + 1 == s.token_ids.size());
        if (want) {
          const size_t at = out->logits.size();
          out->logits.resize(at + o_.vocab_size);
          FakeLogits(h, o_, out->logits.data() + at);
        }
      }
      tokens += static_cast<int64_t>(s.token_ids.size());
      out->row_begin.push_back(static_cast<int64_t>(out->logits.size()) / o_.vocab_size);
    }
    absl::MutexLock lock(&mu_);
    ++steps_done_;
    cv_.SignalAll();
    tokens_processed_ += tokens;
    max_batch_ = std::max<int64_t>(max_batch_, static_cast<int64_t>(in.seqs.size()));
    return absl::OkStatus();
  }

  // Blocking mode: Forward runs `k` more times, then blocks until AllowSteps. -1: unlimited.
  void SetStepBudget(int64_t k) {
    absl::MutexLock lock(&mu_);
    budget_ = k;
    cv_.SignalAll();
  }
  void AllowSteps(int64_t k) {
    absl::MutexLock lock(&mu_);
    if (budget_ >= 0) budget_ += k;
    cv_.SignalAll();
  }
  // Lets one more step run unless one is already allowed and not taken: released repeatedly
  // (PauseGated), the budget never piles up while the engine thread is not scheduled.
  void AllowOneStep() {
    absl::MutexLock lock(&mu_);
    if (budget_ == 0) budget_ = 1;
    cv_.SignalAll();
  }
  // Waits until at least `n` forward calls completed in total.
  void WaitForSteps(int64_t n) {
    absl::MutexLock lock(&mu_);
    while (steps_done_ < n) cv_.Wait(&mu_);
  }
  void FailNextForward() {
    absl::MutexLock lock(&mu_);
    fail_next_ = true;
  }
  int64_t steps_done() {
    absl::MutexLock lock(&mu_);
    return steps_done_;
  }
  int64_t tokens_processed() {
    absl::MutexLock lock(&mu_);
    return tokens_processed_;
  }
  int64_t max_batch() {
    absl::MutexLock lock(&mu_);
    return max_batch_;
  }

 private:
  struct Slot {
    int64_t pos = -1;
    uint64_t hash = 0;
  };

  FakeRunnerOptions o_;
  model_io::ModelConfig config_;
  std::vector<Slot> kv_;  // touched only by Forward (engine thread)
  absl::Mutex mu_;
  absl::CondVar cv_;
  int64_t budget_ ABSL_GUARDED_BY(mu_) = -1;
  bool fail_next_ ABSL_GUARDED_BY(mu_) = false;
  int64_t steps_done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t tokens_processed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_batch_ ABSL_GUARDED_BY(mu_) = 0;
};

// Greedy decoding of the fake model computed directly (no KV cache, no engine): stops at EOS
// (unless ignore_eos) or after max_new_tokens.
inline std::vector<int32_t> ReferenceGreedy(const FakeRunnerOptions& o,
                                            const std::vector<int32_t>& prompt,
                                            int32_t max_new_tokens, bool ignore_eos = false) {
  std::vector<float> logits(o.vocab_size);
  uint64_t h = 0;
  std::vector<int32_t> tokens = prompt, out;
  for (size_t p = 0; p < prompt.size(); ++p) h = FakeChain(h, prompt[p], static_cast<int64_t>(p));
  while (static_cast<int32_t>(out.size()) < max_new_tokens) {
    FakeLogits(h, o, logits.data());
    int32_t best = 0;
    for (int32_t v = 1; v < o.vocab_size; ++v) {
      if (logits[v] > logits[best]) best = v;
    }
    out.push_back(best);
    tokens.push_back(best);
    bool eos = false;
    for (int32_t e : o.eos_token_ids) eos |= e == best;
    if (eos && !ignore_eos) break;
    h = FakeChain(h, best, static_cast<int64_t>(tokens.size()) - 1);
  }
  return out;
}

}  // namespace rl::engine::testing
