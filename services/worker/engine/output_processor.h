// OutputProcessor: what the engine reports for its sequences. It appends a sampled token to
// a sequence (its logprob, weight-version run, penalty counts), streams it through the
// request's on_output, decides whether the sequence stops there (EOS, stop token ids, stop
// strings, max_new_tokens), records the routing of computed positions (R3), and builds and
// delivers the final GenerateResult. No KV, no policy: the scheduler frees the KV of a finished
// sequence and then calls Finish.
//
// Stop strings are matched on the completion's text as a TextDecoder::Stream makes it, one
// token at a time (no window is decoded again per step); the text searched is the new text plus
// the last (longest stop string - 1) bytes before it. Without a decoder stop strings are never
// matched (ValidateRequest rejects them). Thread safety: none; engine thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "services/worker/engine/batch.h"
#include "services/worker/engine/request.h"
#include "services/worker/engine/sequence.h"
#include "services/worker/engine/text_decoder.h"

namespace rl::engine {

struct OutputProcessorOptions {
  std::vector<int32_t> eos_token_ids;
  // Routing values per token (MoE layers · top_k), 0 when the runner exports none.
  int64_t routing_width = 0;
  int64_t routing_layers = 0;
  int64_t routing_top_k = 0;
};

class OutputProcessor {
 public:
  // `decoder` may be null; it must outlive the processor.
  OutputProcessor(OutputProcessorOptions options, const TextDecoder* decoder)
      : options_(std::move(options)), decoder_(decoder) {}

  // Appends `sampled`'s token (>= 0) to `seq`, sampled with weights `weight_version`, and
  // streams it. Returns why the sequence stops after this token, if it does.
  std::optional<FinishReason> Append(Sequence* seq, SampledEntry* sampled, int64_t weight_version,
                                     int64_t now_us);
  // Why `seq` stops after its latest token `token`, if it does.
  // Stop strings are looked for in seq.stop_tail (see AppendStopText).
  std::optional<FinishReason> CheckStop(const Sequence& seq, int32_t token) const;
  // Appends the routing of the entry's positions not recorded yet; the entry's tokens start at
  // token `first_token` of the step's routing arrays.
  void RecordRouting(const BatchEntry& entry, const SampledBatch& sampled, int64_t first_token);
  // Builds `seq`'s GenerateResult (moving its outputs out) and delivers it through on_finish.
  // `weight_version` is the engine's current version.
  void Finish(Sequence* seq, FinishReason reason, int64_t weight_version, int64_t now_us);

  int64_t generated_tokens() const { return generated_tokens_; }
  int64_t num_finished() const { return num_finished_; }
  int64_t num_aborted() const { return num_aborted_; }
  int64_t num_stale() const { return num_stale_; }

 private:
  // Stop strings: feeds `token` to the sequence's text stream and appends the text it made
  // final to seq->stop_tail; TrimStopText then drops what no stop string can still end in.
  void AppendStopText(Sequence* seq, int32_t token) const;
  void TrimStopText(Sequence* seq) const;

  OutputProcessorOptions options_;
  const TextDecoder* decoder_;
  int64_t generated_tokens_ = 0;
  int64_t num_finished_ = 0;
  int64_t num_aborted_ = 0;
  int64_t num_stale_ = 0;
};

}  // namespace rl::engine
