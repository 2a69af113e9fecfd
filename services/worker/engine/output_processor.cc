#include "services/worker/engine/output_processor.h"

#include <algorithm>
#include <string>
#include <utility>

namespace rl::engine {
namespace {

bool Contains(const std::vector<int32_t>& v, int32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

std::optional<FinishReason> OutputProcessor::Append(Sequence* seq, SampledEntry* sampled,
                                                    int64_t weight_version, int64_t now_us) {
  const GenerateRequest& r = seq->request();
  const int32_t token = sampled->token;
  OutputChunk chunk;
  chunk.id = r.id;
  chunk.index = seq->index;
  chunk.token_ids.push_back(token);
  if (r.return_logprob && sampled->logprob.has_value()) {
    chunk.logprobs.push_back(*sampled->logprob);
    seq->output_logprobs.push_back(*std::move(sampled->logprob));
  }
  seq->tokens.push_back(token);
  if (seq->version_segments.empty() ||
      seq->version_segments.back().weight_version != weight_version) {
    seq->version_segments.push_back(VersionSegment{weight_version, 0});
  }
  ++seq->version_segments.back().num_tokens;
  ++seq->output_counts[token];
  ++generated_tokens_;
  if (seq->first_token_us < 0) seq->first_token_us = now_us;
  if (seq->group->callbacks.on_output) seq->group->callbacks.on_output(chunk);
  AppendStopText(seq, token);
  std::optional<FinishReason> stop = CheckStop(*seq, token);
  TrimStopText(seq);
  return stop;
}

void OutputProcessor::AppendStopText(Sequence* seq, int32_t token) const {
  const SamplingParams& p = seq->params();
  if (p.stop.empty() || decoder_ == nullptr) return;
  if (seq->stop_stream == nullptr) {
    seq->stop_stream = decoder_->NewStream(
        absl::MakeConstSpan(seq->tokens.data(), static_cast<size_t>(seq->prompt_len)));
    // A resume: the earlier output's text comes first (a stop string may span the boundary);
    // only its last max_len - 1 bytes are kept, so no match lies wholly in the earlier part.
    const size_t resumed = seq->request().resumed_ids.size();
    if (resumed > 0) {
      for (size_t i = 0; i < resumed; ++i) {
        seq->stop_tail += seq->stop_stream->Step(seq->tokens[seq->prompt_len + i]);
      }
      size_t max_len = 0;
      for (const std::string& s : p.stop) max_len = std::max(max_len, s.size());
      if (seq->stop_tail.size() > max_len - 1) {
        seq->stop_tail.erase(0, seq->stop_tail.size() - (max_len - 1));
      }
    }
  }
  seq->stop_tail += seq->stop_stream->Step(token);
}

void OutputProcessor::TrimStopText(Sequence* seq) const {
  const SamplingParams& p = seq->params();
  if (p.stop.empty() || decoder_ == nullptr) return;
  size_t max_len = 0;
  for (const std::string& s : p.stop) max_len = std::max(max_len, s.size());
  // Once stop strings are looked for, a match must end in text still to come: keep the last
  // max_len - 1 bytes. Before min_new_tokens, text already made may still hold a whole stop
  // string matched at the first eligible token: keep a window like the old decoded one.
  const size_t keep = seq->output_len() >= p.min_new_tokens ? max_len - 1 : 4 * max_len + 8;
  if (seq->stop_tail.size() > keep) seq->stop_tail.erase(0, seq->stop_tail.size() - keep);
}

std::optional<FinishReason> OutputProcessor::CheckStop(const Sequence& seq, int32_t token) const {
  const SamplingParams& p = seq.params();
  const int32_t out_len = seq.output_len();
  if (out_len >= p.min_new_tokens) {
    if ((!p.ignore_eos && Contains(options_.eos_token_ids, token)) ||
        Contains(p.stop_token_ids, token)) {
      return FinishReason{FinishKind::kStop, token, "", ""};
    }
    if (!p.stop.empty() && decoder_ != nullptr) {
      // Earliest match in the tail: the text made final by this token, after the bytes kept
      // from before (a stop string may span tokens).
      size_t best_pos = std::string::npos;
      const std::string* best = nullptr;
      for (const std::string& s : p.stop) {
        const size_t pos = seq.stop_tail.find(s);
        if (pos != std::string::npos && (best == nullptr || pos < best_pos)) {
          best_pos = pos;
          best = &s;
        }
      }
      if (best != nullptr) return FinishReason{FinishKind::kStop, -1, *best, ""};
    }
  }
  if (out_len >= p.max_new_tokens) return FinishReason{FinishKind::kLength, -1, "", ""};
  return std::nullopt;
}

void OutputProcessor::RecordRouting(const BatchEntry& e, const SampledBatch& out,
                                    int64_t first_token) {
  Sequence* seq = e.seq;
  if (!seq->request().return_routed_experts) return;
  const int64_t width = options_.routing_width;
  const bool weights = seq->request().return_expert_weights;
  // Positions before routing_next were recorded when first computed (before a retraction).
  for (int64_t p = std::max(e.start, seq->routing_next); p < e.start + e.count; ++p) {
    if (p != seq->routing_next) break;  // never leave a gap (MatchLimit prevents one)
    const size_t at = static_cast<size_t>((first_token + p - e.start) * width);
    seq->routed_experts.insert(seq->routed_experts.end(), out.routed_experts.begin() + at,
                               out.routed_experts.begin() + at + width);
    if (weights) {
      seq->expert_weights.insert(seq->expert_weights.end(), out.routed_weights.begin() + at,
                                 out.routed_weights.begin() + at + width);
    }
    ++seq->routing_next;
  }
}
void OutputProcessor::Finish(Sequence* seq, FinishReason reason, int64_t weight_version,
                             int64_t now_us) {
  if (reason.kind == FinishKind::kAbort) ++num_aborted_;
  if (reason.kind == FinishKind::kStale) ++num_stale_;
  ++num_finished_;

  GenerateResult result;
  result.id = seq->request().id;
  result.index = seq->index;
  result.finish_reason = std::move(reason);
  result.output_ids.assign(seq->tokens.begin() + seq->prompt_len, seq->tokens.end());
  result.output_logprobs = std::move(seq->output_logprobs);
  result.prompt_logprobs = std::move(seq->prompt_logprobs);
  result.prompt_logprob_start = std::max(seq->request().logprob_start_len, 1);
  result.prompt_tokens = seq->prompt_len;
  result.completion_tokens = seq->output_len();
  result.cached_tokens = std::max(seq->cached_tokens, 0);
  result.num_retractions = seq->num_retractions;
  result.weight_version =
      seq->version_segments.empty() || seq->version_segments.back().weight_version < 0
          ? weight_version
          : seq->version_segments.back().weight_version;
  result.resumed_tokens = static_cast<int32_t>(seq->request().resumed_ids.size());
  result.dispatch_weight_version = seq->dispatch_version;
  result.weight_version_segments = std::move(seq->version_segments);
  result.kv_from_older_version = seq->kv_from_older_version;
  result.oldest_kv_weight_version = seq->kv_from_older_version ? seq->oldest_kv_version : 0;
  if (seq->request().return_routed_experts) {
    result.routed_experts = std::move(seq->routed_experts);
    result.expert_weights = std::move(seq->expert_weights);
    result.routed_experts_start = seq->request().routed_experts_start_len;
    result.routed_num_layers = static_cast<int32_t>(options_.routing_layers);
    result.routed_top_k = static_cast<int32_t>(options_.routing_top_k);
  }
  const int64_t submit = seq->group->submit_us;
  result.timings.queue_us =
      seq->first_scheduled_us < 0 ? now_us - submit : seq->first_scheduled_us - submit;
  result.timings.ttft_us = seq->first_token_us < 0 ? 0 : seq->first_token_us - submit;
  result.timings.total_us = now_us - submit;
  if (seq->group->callbacks.on_finish) seq->group->callbacks.on_finish(std::move(result));
}

}  // namespace rl::engine
