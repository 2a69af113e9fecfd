#include "services/worker/engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "services/worker/engine/sampler.h"

namespace rl::engine {
namespace {

// A running sequence's remaining max_new_tokens counted in the admission reservation is capped
// (long max_new_tokens would otherwise block admission on a guess).
constexpr int64_t kReserveCapTokens = 4096;
// Retraction raises new_token_ratio as if each running sequence still needed this many steps.
constexpr int64_t kRetractDecodeSteps = 20;
// Waiting sequences skipped in one scheduling pass because their prefix is being prefilled.
constexpr int32_t kMaxDeferredScan = 256;

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options, const TextDecoder* decoder)
    : options_(options),
      output_(OutputProcessorOptions{options.eos_token_ids, options.routing_width,
                                     options.routing_layers, options.routing_top_k},
              decoder),
      kv_(options.num_kv_slots, options.page_size, options.max_running_requests,
          static_cast<int32_t>(std::max<int64_t>(
              1, std::min<int64_t>(options.max_context_len,
                                   options.num_kv_slots / options.page_size * options.page_size)))),
      new_token_ratio_(options.init_new_token_ratio),
      new_token_ratio_decay_((options.init_new_token_ratio - options.min_new_token_ratio) /
                             std::max(1, options.new_token_ratio_decay_steps)) {}

void Scheduler::Add(std::shared_ptr<RequestGroup> group, uint64_t seed) {
  const GenerateRequest& r = group->request;
  const uint64_t base_seed = r.sampling.seed.value_or(seed);
  for (int32_t i = 0; i < r.sampling.n; ++i) {
    auto seq = std::make_unique<Sequence>();
    seq->group = group;
    seq->index = i;
    seq->seed = DeriveSeed(base_seed, i);
    seq->prompt_len = static_cast<int32_t>(r.input_ids.size());
    seq->tokens = r.input_ids;
    seq->tokens.reserve(r.input_ids.size() + r.sampling.max_new_tokens);
    if (!r.resumed_ids.empty()) AddResumed(seq.get());
    seq->prompt_logprobs_done = !(r.return_logprob && r.logprob_start_len >= 0);
    seq->routing_next = r.routed_experts_start_len;
    seq->dispatch_version = weight_version_;
    seq->max_version_lag = r.max_version_lag.value_or(options_.default_max_version_lag);
    (hold_new_ ? held_ : waiting_).push_back(std::move(seq));
  }
  if (!r.versions.any()) versions_unchecked_ = true;
  prompt_tokens_ += static_cast<int64_t>(r.input_ids.size());
}

void Scheduler::AddResumed(Sequence* seq) {
  const GenerateRequest& r = seq->request();
  // The earlier tokens are output (counted against max_new_tokens, penalised as completion
  // tokens) that is not in the KV yet: the first prefill computes prompt + earlier output and
  // samples the next token from the last position, as after a retraction.
  seq->tokens.insert(seq->tokens.end(), r.resumed_ids.begin(), r.resumed_ids.end());
  for (int32_t t : r.resumed_ids) ++seq->output_counts[t];
  if (r.return_logprob) {
    for (size_t i = 0; i < r.resumed_ids.size(); ++i) {
      seq->output_logprobs.push_back(TokenLogprob{
          r.resumed_ids[i], r.resumed_logprobs.empty() ? std::nan("") : r.resumed_logprobs[i], {}});
    }
  }
  seq->version_segments = r.resumed_segments;
  if (seq->version_segments.empty()) {
    seq->version_segments.push_back(
        VersionSegment{-1, static_cast<int32_t>(r.resumed_ids.size())});  // unknown
  }
}

// ---------------------------------------------------------------------------------------------
// Retraction and flush

void Scheduler::Retract(std::unique_ptr<Sequence> seq) {
  kv_.Release(seq.get(), /*cache=*/false);
  if (!seq->prompt_logprobs_done) seq->prompt_logprobs.clear();
  ++seq->num_retractions;
  ++num_retractions_;
  waiting_.push_front(std::move(seq));
}

void Scheduler::RetractNewest() {
  std::unique_ptr<Sequence> victim = std::move(running_.back());
  running_.pop_back();
  ++running_epoch_;
  Retract(std::move(victim));
  int64_t decoded = 0, max_new = 0;
  for (const auto& s : running_) {
    decoded += s->output_len();
    max_new += s->params().max_new_tokens;
  }
  const double ratio =
      max_new == 0 ? 1.0
                   : static_cast<double>(decoded + kRetractDecodeSteps *
                                                       static_cast<int64_t>(running_.size())) /
                         static_cast<double>(max_new);
  new_token_ratio_ = std::max(new_token_ratio_, std::min(1.0, ratio));
}

void Scheduler::RetractAll() {
  while (!running_.empty()) {
    std::unique_ptr<Sequence> seq = std::move(running_.back());
    running_.pop_back();
    ++running_epoch_;
    Retract(std::move(seq));
  }
}

void Scheduler::Hold(bool hold) {
  hold_new_ = hold;
  if (hold) return;
  while (!held_.empty()) {
    waiting_.push_back(std::move(held_.front()));
    held_.pop_front();
  }
}

int32_t Scheduler::KeepKvThroughUpdate() {
  int32_t kept = 0;
  for (const auto& s : running_) {
    if (s->num_computed == 0) continue;  // no KV written yet: computed with the new weights
    if (!s->kv_from_older_version) {
      s->kv_from_older_version = true;
      s->oldest_kv_version = s->kv_version;
    }
    ++kept;
  }
  kv_.EvictUnlocked();
  return kept;
}

absl::Status Scheduler::Flush() {
  if (!running_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot flush the cache: ", running_.size(), " sequences are running"));
  }
  kv_.Reset();
  forward_ct_decode_ = 0;
  new_token_ratio_ = options_.init_new_token_ratio;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Scheduling

int64_t Scheduler::MatchLimit(const Sequence& seq) const {
  int64_t limit = static_cast<int64_t>(seq.tokens.size()) - 1;
  if (!seq.prompt_logprobs_done) {
    const int64_t first = std::max(seq.request().logprob_start_len, 1);
    limit = std::min(limit, first - 1);
  }
  // R3: positions whose routing is not recorded yet are computed, never taken from the cache.
  if (seq.request().return_routed_experts) limit = std::min(limit, seq.routing_next);
  return std::max<int64_t>(limit, 0);
}

bool Scheduler::PrefixInFlight(const Sequence& seq, int64_t matched,
                               const std::vector<const Sequence*>& in_flight) const {
  const int32_t ps = options_.page_size;
  const int64_t limit = MatchLimit(seq) / ps * ps;
  if (limit < matched + ps) return false;
  for (const Sequence* other : in_flight) {
    const int64_t n = std::min<int64_t>(limit, static_cast<int64_t>(other->tokens.size()) - 1);
    int64_t common = 0;
    while (common < n && seq.tokens[common] == other->tokens[common]) ++common;
    if (common / ps * ps >= matched + ps) return true;
  }
  return false;
}

int64_t Scheduler::ReservedTokens() const {
  int64_t reserved = 0;
  for (const auto& s : running_) {
    const int64_t left =
        std::min<int64_t>(s->params().max_new_tokens - s->output_len(), kReserveCapTokens);
    reserved += static_cast<int64_t>(s->tokens.size()) - s->num_allocated;
    reserved += static_cast<int64_t>(std::ceil(std::max<int64_t>(left, 0) * new_token_ratio_));
  }
  return reserved;
}

void Scheduler::AddEntry(ScheduledBatch* batch, Sequence* seq, int64_t count) {
  BatchEntry e;
  e.seq = seq;
  e.start = seq->num_computed;
  e.count = count;
  const int64_t end = e.start + count;
  const bool at_end = end == static_cast<int64_t>(seq->tokens.size());
  bool need_prompt_rows = false;
  if (!seq->prompt_logprobs_done) {
    const int64_t first = std::max(seq->request().logprob_start_len, 1);
    need_prompt_rows = end - 1 >= first - 1 && e.start <= seq->prompt_len - 2;
  }
  if (need_prompt_rows) {
    e.logits = model::LogitsMode::kAll;
  } else if (at_end && seq->output_len() < seq->params().max_new_tokens) {
    e.logits = model::LogitsMode::kLast;
  } else {
    e.logits = model::LogitsMode::kNone;
  }
  model::SequenceInput in;
  in.token_ids.assign(seq->tokens.begin() + e.start, seq->tokens.begin() + end);
  in.start_pos = static_cast<int32_t>(e.start);
  absl::Span<const int32_t> row = kv_.row(*seq);
  in.kv_slots.assign(row.begin(), row.begin() + end);
  in.logits = e.logits;
  if (seq->request().return_routed_experts && options_.routing_width > 0) {
    batch->input.return_routing = true;
  }
  batch->input.seqs.push_back(std::move(in));
  batch->entries.push_back(e);
  if (count == 1 && seq->output_len() > 0) {
    ++batch->num_decode;
  } else {
    batch->num_prefill_tokens += count;
  }
}

bool Scheduler::TryAdmit(Sequence* seq, int64_t budget, int64_t* chunk) {
  const int64_t len = static_cast<int64_t>(seq->tokens.size());
  RadixCache::MatchResult m =
      kv_.Match(weight_version_, absl::MakeConstSpan(seq->tokens.data(), MatchLimit(*seq)));
  const int64_t extend = len - m.num_tokens;
  *chunk = std::min(extend, budget);
  if (!running_.empty()) {
    const int64_t left =
        std::min<int64_t>(seq->params().max_new_tokens - seq->output_len(), kReserveCapTokens);
    const int64_t need = extend + static_cast<int64_t>(std::ceil(left * new_token_ratio_));
    const int64_t avail = kv_.available_tokens() + kv_.evictable_tokens() - ReservedTokens();
    if (avail < need) return false;
  }
  if (!kv_.Admit(seq, m, weight_version_)) return false;
  if (!kv_.Grow(seq, m.num_tokens + *chunk)) {
    kv_.Release(seq, /*cache=*/false);
    return false;
  }
  if (seq->cached_tokens < 0) seq->cached_tokens = static_cast<int32_t>(m.num_tokens);
  cache_hit_tokens_ += m.num_tokens;
  return true;
}

ScheduledBatch Scheduler::BuildOnce(int64_t now_us) {
  ScheduledBatch batch;
  // 1. Decode: one token for every sequence with a single uncomputed token. Retract the newest
  //    sequences until the pages fit.
  auto decode_pages = [this] {
    int64_t need = 0;
    for (const auto& s : running_) {
      if (s->remaining() == 1) need += kv_.PagesToGrow(*s, s->num_computed + 1);
    }
    return need;
  };
  while (running_.size() > 1 && !kv_.EnsureFreePages(decode_pages())) RetractNewest();
  for (const auto& s : running_) {
    if (s->remaining() == 1 && kv_.Grow(s.get(), s->num_computed + 1)) AddEntry(&batch, s.get(), 1);
  }

  // 2. Chunked prefills already running, oldest first.
  int64_t budget = options_.chunked_prefill_size;
  std::vector<const Sequence*> in_flight;
  for (const auto& s : running_) {
    if (s->remaining() <= 1) continue;
    in_flight.push_back(s.get());
    const int64_t c = std::min(s->remaining(), budget);
    if (c > 0 && kv_.Grow(s.get(), s->num_computed + c)) {
      AddEntry(&batch, s.get(), c);
      budget -= c;
    }
  }

  // 3. Admit waiting sequences FCFS.
  int32_t deferred = 0;
  for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0;) {
    if (kv_.num_free_rows() == 0) break;
    Sequence* seq = it->get();
    const int64_t matched =
        kv_.Match(weight_version_, absl::MakeConstSpan(seq->tokens.data(), MatchLimit(*seq)))
            .num_tokens;
    if (PrefixInFlight(*seq, matched, in_flight)) {
      if (++deferred > kMaxDeferredScan) break;
      ++it;
      continue;
    }
    int64_t chunk = 0;
    if (!TryAdmit(seq, budget, &chunk)) break;
    if (seq->first_scheduled_us < 0) seq->first_scheduled_us = now_us;
    running_.push_back(std::move(*it));
    ++running_epoch_;
    it = waiting_.erase(it);
    AddEntry(&batch, seq, chunk);
    in_flight.push_back(seq);
    budget -= chunk;
  }
  return batch;
}

void Scheduler::EnforceVersions(int64_t now_us) {
  versions_unchecked_ = false;
  versions_checked_ = weight_version_;
  auto visit = [&](const std::unique_ptr<Sequence>& s) {
    if (s->finished) return;
    const VersionConstraint& c = s->request().versions;
    if (!c.Accepts(weight_version_)) {
      Finish(s.get(),
             FinishReason{FinishKind::kAbort, -1, "",
                          absl::StrCat("weight version: this worker now serves version ",
                                       weight_version_, "; the request accepts ", c.Describe(),
                                       " (retry: the router routes it to a worker that does)")},
             /*cache_kv=*/false, now_us);
      return;
    }
    const int64_t lag = weight_version_ - s->dispatch_version;
    if (s->max_version_lag >= 0 && lag > s->max_version_lag) {
      Finish(s.get(),
             FinishReason{
                 FinishKind::kStale, -1, "",
                 absl::StrCat("stale: the weight version moved from ", s->dispatch_version,
                              " (dispatch) to ", weight_version_, ", more than max_version_lag ",
                              s->max_version_lag, " past it; the partial output is returned")},
             /*cache_kv=*/false, now_us);
    }
  };
  for (const auto& s : running_) visit(s);
  for (const auto& s : waiting_) visit(s);
  for (const auto& s : held_) visit(s);
  RemoveFinished(/*include_waiting=*/true);
}

ScheduledBatch Scheduler::Schedule(int64_t now_us) {
  // A request never runs a step on weights it does not accept: checked whenever the version
  // moved or a constrained request arrived (O(requests) then, nothing otherwise).
  if (versions_unchecked_ || versions_checked_ != weight_version_) EnforceVersions(now_us);
  while (true) {
    ScheduledBatch batch = BuildOnce(now_us);
    if (!batch.empty() || !HasWork()) {
      if (batch.num_decode > 0) {
        ++forward_ct_decode_;
        new_token_ratio_ =
            std::max(options_.min_new_token_ratio, new_token_ratio_ - new_token_ratio_decay_);
      }
      return batch;
    }
    if (!running_.empty()) {
      RetractNewest();
      continue;
    }
    // Nothing runs and the head of the queue cannot be admitted into an empty pool: it can
    // never run. Validation makes this unreachable; finish it rather than spin.
    Sequence* head = waiting_.front().get();
    Finish(head,
           FinishReason{FinishKind::kAbort, -1, "",
                        "request does not fit in the KV cache even when running alone"},
           /*cache_kv=*/false, now_us);
    RemoveFinished(/*include_waiting=*/true);
  }
}

// ---------------------------------------------------------------------------------------------
// Outputs

void Scheduler::ProcessEntry(const BatchEntry& entry, SampledEntry* sampled, int64_t now_us) {
  Sequence* seq = entry.seq;
  const SamplingParams& p = seq->params();
  seq->num_computed = entry.start + entry.count;
  for (TokenLogprob& lp : sampled->prompt_logprobs) seq->prompt_logprobs.push_back(std::move(lp));
  if (seq->num_computed >= seq->prompt_len) seq->prompt_logprobs_done = true;
  if (entry.count > 1 && !seq->kv_from_older_version) kv_.CacheUnfinished(seq);
  if (seq->remaining() > 0) return;  // more prefill chunks to go

  if (seq->output_len() >= p.max_new_tokens) {
    Finish(seq, FinishReason{FinishKind::kLength, -1, "", ""}, /*cache_kv=*/true, now_us);
    return;
  }
  if (sampled->token < 0) {
    Finish(seq, FinishReason{FinishKind::kAbort, -1, "", "internal: no logits for sampling"},
           /*cache_kv=*/false, now_us);
    return;
  }
  std::optional<FinishReason> stop = output_.Append(seq, sampled, weight_version_, now_us);
  if (stop.has_value()) Finish(seq, *std::move(stop), /*cache_kv=*/true, now_us);
}

void Scheduler::Update(const ScheduledBatch& batch, SampledBatch* sampled, int64_t now_us) {
  const size_t n = batch.entries.size();
  if (sampled->entries.size() != n) {
    FailBatch(batch, absl::InternalError("sampler returned the wrong number of entries"), now_us);
    return;
  }
  int64_t total_tokens = 0;
  for (const BatchEntry& e : batch.entries) total_tokens += e.count;
  const int64_t width = options_.routing_width;
  // Ids and weights both: OutputProcessor::RecordRouting reads weights at the ids' offsets.
  if (batch.input.return_routing &&
      (static_cast<int64_t>(sampled->routed_experts.size()) != total_tokens * width ||
       sampled->routed_weights.size() != sampled->routed_experts.size())) {
    FailBatch(batch, absl::InternalError("model runner returned routing of the wrong shape"),
              now_us);
    return;
  }
  int64_t token = 0;
  for (size_t i = 0; i < n; ++i) {
    const BatchEntry& e = batch.entries[i];
    if (batch.input.return_routing) output_.RecordRouting(e, *sampled, token);
    token += e.count;
    ProcessEntry(e, &sampled->entries[i], now_us);
  }
  RemoveFinished(/*include_waiting=*/false);
}

void Scheduler::FailBatch(const ScheduledBatch& batch, const absl::Status& error, int64_t now_us) {
  for (const BatchEntry& e : batch.entries) {
    Finish(e.seq,
           FinishReason{FinishKind::kAbort, -1, "",
                        absl::StrCat("model forward failed: ", error.ToString())},
           /*cache_kv=*/false, now_us);
  }
  RemoveFinished(/*include_waiting=*/false);
}

void Scheduler::Finish(Sequence* seq, FinishReason reason, bool cache_kv, int64_t now_us) {
  // KV of mixed versions (an in-flight update kept it) is never cached.
  kv_.Release(seq, cache_kv && !seq->kv_from_older_version);
  seq->finished = true;
  finished_.push_back(seq);
  output_.Finish(seq, std::move(reason), weight_version_, now_us);
}

void Scheduler::RemoveFinished(bool include_waiting) {
  if (finished_.empty()) return;
  auto done = [](const std::unique_ptr<Sequence>& s) { return s->finished; };
  const size_t before = running_.size();
  running_.erase(std::remove_if(running_.begin(), running_.end(), done), running_.end());
  if (running_.size() != before) ++running_epoch_;
  if (include_waiting) {
    waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), done), waiting_.end());
    held_.erase(std::remove_if(held_.begin(), held_.end(), done), held_.end());
  }
  finished_.clear();
}

int32_t Scheduler::Abort(const std::string& id, const std::string& message, int64_t now_us) {
  int32_t count = 0;
  auto visit = [&](const std::unique_ptr<Sequence>& s) {
    if (s->finished || s->request().id != id) return;
    Finish(s.get(), FinishReason{FinishKind::kAbort, -1, "", message}, /*cache_kv=*/true, now_us);
    ++count;
  };
  for (const auto& s : running_) visit(s);
  for (const auto& s : waiting_) visit(s);
  for (const auto& s : held_) visit(s);
  RemoveFinished(/*include_waiting=*/true);
  return count;
}

int32_t Scheduler::AbortAll(const std::string& message, int64_t now_us) {
  int32_t count = 0;
  auto visit = [&](const std::unique_ptr<Sequence>& s) {
    if (s->finished) return;
    Finish(s.get(), FinishReason{FinishKind::kAbort, -1, "", message}, /*cache_kv=*/true, now_us);
    ++count;
  };
  for (const auto& s : running_) visit(s);
  for (const auto& s : waiting_) visit(s);
  for (const auto& s : held_) visit(s);
  RemoveFinished(/*include_waiting=*/true);
  return count;
}

std::vector<std::string> Scheduler::RunningIds() const {
  std::vector<std::string> ids;
  ids.reserve(running_.size());
  for (const auto& s : running_) {
    ids.push_back(s->index == 0 ? s->request().id : absl::StrCat(s->request().id, "#", s->index));
  }
  return ids;
}

SchedulerStats Scheduler::Stats() const {
  SchedulerStats st;
  st.num_running = static_cast<int32_t>(running_.size());
  for (const auto& s : running_) st.has_chunked_prefill |= s->remaining() > 1;
  st.num_waiting = static_cast<int32_t>(waiting_.size());
  st.num_held = static_cast<int32_t>(held_.size());
  st.total_kv_tokens = kv_.total_tokens();
  st.available_kv_tokens = kv_.available_tokens();
  st.evictable_kv_tokens = kv_.evictable_tokens();
  st.tree_cache_tokens = kv_.cached_tokens();
  st.tree_cache_nodes = kv_.num_cache_nodes();
  st.req_to_token_used = kv_.num_used_rows();
  st.req_to_token_total = kv_.num_rows();
  st.forward_ct_decode = forward_ct_decode_;
  st.new_token_ratio = new_token_ratio_;
  st.num_finished = output_.num_finished();
  st.num_aborted = output_.num_aborted();
  st.num_stale = output_.num_stale();
  st.num_retractions = num_retractions_;
  st.cache_hit_tokens = cache_hit_tokens_;
  st.prompt_tokens = prompt_tokens_;
  st.generated_tokens = output_.generated_tokens();
  return st;
}

absl::Status Scheduler::CheckInvariants() const {
  for (const auto* queue : {&waiting_, &held_}) {
    for (const auto& s : *queue) {
      if (s->row >= 0 || s->last_node != nullptr) {
        return absl::InternalError(absl::StrCat(s->request().id, " waits while holding KV"));
      }
    }
  }
  std::vector<const Sequence*> running;
  running.reserve(running_.size());
  for (const auto& s : running_) running.push_back(s.get());
  return kv_.CheckInvariants(running);
}

}  // namespace rl::engine
