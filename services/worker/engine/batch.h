// The batch that one engine step hands from stage to stage:
//
//   ScheduledBatch batch = scheduler.Schedule();       // policy: who runs, KV allocated
//   runner.Forward(batch.input, &out);                 // model: logits (+ routing)
//   sampler.Sample(batch, &out, &sampled);             // sampling: tokens, logprobs
//   scheduler.Update(batch, sampled);                  // bookkeeping, outputs, finishes
//
// Plain structs, no behaviour. A BatchEntry points at a sequence the scheduler owns; it is
// valid until the step's Update (or FailBatch) returns.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "services/worker/engine/request.h"
#include "services/worker/engine/sequence.h"
#include "services/worker/model/forward_batch.h"

namespace rl::engine {

// One sequence's share of a step.
struct BatchEntry {
  Sequence* seq = nullptr;
  int64_t start = 0;  // first position processed this step
  int64_t count = 0;  // tokens processed this step
  model::LogitsMode logits = model::LogitsMode::kNone;
};

struct ScheduledBatch {
  std::vector<BatchEntry> entries;
  model::ForwardInput input;  // entries[i] ↔ input.seqs[i]
  int32_t num_decode = 0;
  int64_t num_prefill_tokens = 0;
  bool empty() const { return entries.empty(); }
};

// What the sampling stage made of one entry's logits.
struct SampledEntry {
  // The next token, or -1 when none was sampled: a prefill chunk with more to go, a sequence
  // at max_new_tokens, or (a runner bug) no logits row for a sequence that needed one.
  int32_t token = -1;
  // With return_logprob, the sampled token's logprob.
  std::optional<TokenLogprob> logprob;
  // Prompt logprobs of the positions this step computed (return_logprob with
  // logprob_start_len, LogitsMode::kAll).
  std::vector<TokenLogprob> prompt_logprobs;
};

struct SampledBatch {
  std::vector<SampledEntry> entries;  // ↔ ScheduledBatch::entries
  // The runner's routing (R3), moved from its ForwardOutput: see model::ForwardOutput.
  std::vector<int32_t> routed_experts;
  std::vector<float> routed_weights;
};

}  // namespace rl::engine
