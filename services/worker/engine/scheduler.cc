#include "services/worker/engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "services/worker/engine/sampler.h"

namespace rl::engine {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A running sequence's remaining max_new_tokens counted in the admission reservation is capped
// (long max_new_tokens would otherwise block admission on a guess).
constexpr int64_t kReserveCapTokens = 4096;
// Retraction raises new_token_ratio as if each running sequence still needed this many steps.
constexpr int64_t kRetractDecodeSteps = 20;
// Waiting sequences skipped in one scheduling pass because their prefix is being prefilled.
constexpr int32_t kMaxDeferredScan = 256;

bool Contains(const std::vector<int32_t>& v, int32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

Scheduler::Scheduler(const SchedulerOptions& options, const TextDecoder* decoder)
    : options_(options),
      decoder_(decoder),
      pool_(options.num_kv_slots, options.page_size),
      req_to_token_(options.max_running_requests,
                    static_cast<int32_t>(std::max<int64_t>(
                        1, std::min<int64_t>(options.max_context_len,
                                             options.num_kv_slots / options.page_size *
                                                 options.page_size)))),
      tree_(options.page_size),
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
    seq->prompt_logprobs_done = !(r.return_logprob && r.logprob_start_len >= 0);
    seq->routing_next = r.routed_experts_start_len;
    seq->dispatch_version = weight_version_;
    waiting_.push_back(std::move(seq));
  }
  prompt_tokens_ += static_cast<int64_t>(r.input_ids.size());
}

// ---------------------------------------------------------------------------------------------
// KV bookkeeping

bool Scheduler::EnsureFreePages(int64_t num_pages) {
  const int64_t missing = num_pages - pool_.num_free_pages();
  if (missing <= 0) return true;
  std::vector<int32_t> evicted;
  tree_.Evict(missing, &evicted);
  pool_.Free(evicted);
  return pool_.num_free_pages() >= num_pages;
}

int64_t Scheduler::PagesToGrow(const Sequence& seq, int64_t new_len) const {
  const int32_t ps = options_.page_size;
  return CeilDiv(new_len, ps) - CeilDiv(seq.num_allocated, ps);
}

bool Scheduler::Grow(Sequence* seq, int64_t new_len) {
  const int32_t ps = options_.page_size;
  const int64_t need = PagesToGrow(*seq, new_len);
  if (!EnsureFreePages(need)) return false;
  scratch_pages_.clear();
  RL_CHECK(pool_.Alloc(need, &scratch_pages_));
  absl::Span<int32_t> row = req_to_token_.row(seq->row);
  const int64_t have_pages = CeilDiv(seq->num_allocated, ps);
  for (int64_t p = seq->num_allocated; p < new_len; ++p) {
    const int64_t pi = p / ps;
    const int32_t page = pi < have_pages ? row[pi * ps] / ps : scratch_pages_[pi - have_pages];
    row[p] = page * ps + static_cast<int32_t>(p % ps);
  }
  seq->num_allocated = new_len;
  return true;
}

void Scheduler::AppendOwnPages(const Sequence& seq, std::vector<int32_t>* pages) const {
  const int32_t ps = options_.page_size;
  absl::Span<const int32_t> row = req_to_token_.row(seq.row);
  for (int64_t pi = seq.cached_len / ps; pi < CeilDiv(seq.num_allocated, ps); ++pi) {
    pages->push_back(row[pi * ps] / ps);
  }
}

void Scheduler::ReleaseKv(Sequence* seq, bool cache) {
  if (seq->row < 0) return;
  const int32_t ps = options_.page_size;
  absl::Span<int32_t> row = req_to_token_.row(seq->row);
  const int64_t n = seq->num_computed / ps * ps;
  if (cache && n > seq->cached_len) {
    std::vector<int32_t> pages;
    pages.reserve(n / ps);
    for (int64_t pi = 0; pi < n / ps; ++pi) pages.push_back(row[pi * ps] / ps);
    std::vector<int32_t> duplicates;
    tree_.Insert(seq->kv_version, absl::MakeConstSpan(seq->tokens.data(), n), pages,
                 &duplicates);
    pool_.Free(duplicates);
    for (int64_t pi = n / ps; pi < CeilDiv(seq->num_allocated, ps); ++pi) {
      pool_.Free(row[pi * ps] / ps);
    }
  } else {
    std::vector<int32_t> own;
    AppendOwnPages(*seq, &own);
    pool_.Free(own);
  }
  tree_.Unlock(seq->last_node);
  seq->last_node = nullptr;
  req_to_token_.Free(seq->row);
  seq->row = -1;
  seq->cached_len = 0;
  seq->num_computed = 0;
  seq->num_allocated = 0;
}

void Scheduler::CacheUnfinished(Sequence* seq) {
  const int32_t ps = options_.page_size;
  const int64_t n = seq->num_computed / ps * ps;
  if (n <= seq->cached_len) return;
  absl::Span<int32_t> row = req_to_token_.row(seq->row);
  std::vector<int32_t> pages;
  pages.reserve(n / ps);
  for (int64_t pi = 0; pi < n / ps; ++pi) pages.push_back(row[pi * ps] / ps);
  std::vector<int32_t> duplicates;
  const auto key = absl::MakeConstSpan(seq->tokens.data(), n);
  tree_.Insert(seq->kv_version, key, pages, &duplicates);
  pool_.Free(duplicates);
  RadixCache::MatchResult m = tree_.Match(seq->kv_version, key);
  RL_CHECK(m.num_tokens == n);
  for (int64_t p = 0; p < n; ++p) row[p] = m.pages[p / ps] * ps + static_cast<int32_t>(p % ps);
  tree_.Lock(m.last_node);
  tree_.Unlock(seq->last_node);
  seq->last_node = m.last_node;
  seq->cached_len = n;
}

void Scheduler::Retract(std::unique_ptr<Sequence> seq) {
  ReleaseKv(seq.get(), /*cache=*/false);
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

absl::Status Scheduler::Flush() {
  if (!running_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot flush the cache: ", running_.size(), " sequences are running"));
  }
  std::vector<int32_t> pages;
  tree_.Reset(&pages);
  pool_.Reset();
  req_to_token_.Reset();
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
    const int64_t left = std::min<int64_t>(s->params().max_new_tokens - s->output_len(),
                                           kReserveCapTokens);
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
  absl::Span<const int32_t> row = req_to_token_.row(seq->row);
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
      tree_.Match(weight_version_, absl::MakeConstSpan(seq->tokens.data(), MatchLimit(*seq)));
  const int64_t extend = len - m.num_tokens;
  *chunk = std::min(extend, budget);
  if (!running_.empty()) {
    const int64_t left = std::min<int64_t>(seq->params().max_new_tokens - seq->output_len(),
                                           kReserveCapTokens);
    const int64_t need = extend + static_cast<int64_t>(std::ceil(left * new_token_ratio_));
    const int64_t avail =
        pool_.available_tokens() + tree_.evictable_tokens() - ReservedTokens();
    if (avail < need) return false;
  }
  std::optional<int32_t> row = req_to_token_.Alloc();
  if (!row.has_value()) return false;
  const int32_t ps = options_.page_size;
  seq->row = *row;
  tree_.Lock(m.last_node);
  seq->last_node = m.last_node;
  absl::Span<int32_t> r = req_to_token_.row(seq->row);
  for (int64_t p = 0; p < m.num_tokens; ++p) {
    r[p] = m.pages[p / ps] * ps + static_cast<int32_t>(p % ps);
  }
  seq->cached_len = seq->num_computed = seq->num_allocated = m.num_tokens;
  seq->kv_version = weight_version_;
  if (!Grow(seq, m.num_tokens + *chunk)) {
    ReleaseKv(seq, /*cache=*/false);
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
      if (s->remaining() == 1) need += PagesToGrow(*s, s->num_computed + 1);
    }
    return need;
  };
  while (running_.size() > 1 && !EnsureFreePages(decode_pages())) RetractNewest();
  for (const auto& s : running_) {
    if (s->remaining() == 1 && Grow(s.get(), s->num_computed + 1)) AddEntry(&batch, s.get(), 1);
  }

  // 2. Chunked prefills already running, oldest first.
  int64_t budget = options_.chunked_prefill_size;
  std::vector<const Sequence*> in_flight;
  for (const auto& s : running_) {
    if (s->remaining() <= 1) continue;
    in_flight.push_back(s.get());
    const int64_t c = std::min(s->remaining(), budget);
    if (c > 0 && Grow(s.get(), s->num_computed + c)) {
      AddEntry(&batch, s.get(), c);
      budget -= c;
    }
  }

  // 3. Admit waiting sequences FCFS.
  int32_t deferred = 0;
  for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0;) {
    if (req_to_token_.num_free() == 0) break;
    Sequence* seq = it->get();
    const int64_t matched =
        tree_.Match(weight_version_,
                    absl::MakeConstSpan(seq->tokens.data(), MatchLimit(*seq)))
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

ScheduledBatch Scheduler::Schedule(int64_t now_us) {
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

bool Scheduler::CheckStop(Sequence* seq, int32_t token, FinishReason* reason) const {
  const SamplingParams& p = seq->params();
  const int32_t out_len = seq->output_len();
  if (out_len >= p.min_new_tokens) {
    if ((!p.ignore_eos && Contains(options_.eos_token_ids, token)) ||
        Contains(p.stop_token_ids, token)) {
      *reason = FinishReason{FinishKind::kStop, token, "", ""};
      return true;
    }
    if (!p.stop.empty() && decoder_ != nullptr) {
      size_t max_len = 0;
      for (const std::string& s : p.stop) max_len = std::max(max_len, s.size());
      const int64_t window = std::min<int64_t>(out_len, 4 * static_cast<int64_t>(max_len) + 8);
      const std::string text = decoder_->Decode(
          absl::MakeConstSpan(seq->tokens.data() + seq->tokens.size() - window, window));
      size_t best_pos = std::string::npos;
      const std::string* best = nullptr;
      for (const std::string& s : p.stop) {
        const size_t pos = text.find(s);
        if (pos != std::string::npos && (best == nullptr || pos < best_pos)) {
          best_pos = pos;
          best = &s;
        }
      }
      if (best != nullptr) {
        *reason = FinishReason{FinishKind::kStop, -1, *best, ""};
        return true;
      }
    }
  }
  if (out_len >= p.max_new_tokens) {
    *reason = FinishReason{FinishKind::kLength, -1, "", ""};
    return true;
  }
  return false;
}

void Scheduler::ProcessEntry(const BatchEntry& entry, SampledEntry* sampled, int64_t now_us) {
  Sequence* seq = entry.seq;
  const GenerateRequest& r = seq->request();
  const SamplingParams& p = seq->params();
  seq->num_computed = entry.start + entry.count;
  for (TokenLogprob& lp : sampled->prompt_logprobs) seq->prompt_logprobs.push_back(std::move(lp));
  if (seq->num_computed >= seq->prompt_len) seq->prompt_logprobs_done = true;
  if (entry.count > 1) CacheUnfinished(seq);
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
      seq->version_segments.back().weight_version != weight_version_) {
    seq->version_segments.push_back(VersionSegment{weight_version_, 0});
  }
  ++seq->version_segments.back().num_tokens;
  ++seq->output_counts[token];
  ++generated_tokens_;
  if (seq->first_token_us < 0) seq->first_token_us = now_us;
  if (seq->group->callbacks.on_output) seq->group->callbacks.on_output(chunk);

  FinishReason reason;
  if (CheckStop(seq, token, &reason)) Finish(seq, std::move(reason), /*cache_kv=*/true, now_us);
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
  if (batch.input.return_routing &&
      static_cast<int64_t>(sampled->routed_experts.size()) != total_tokens * width) {
    FailBatch(batch, absl::InternalError("model runner returned routing of the wrong shape"),
              now_us);
    return;
  }
  int64_t token = 0;
  for (size_t i = 0; i < n; ++i) {
    const BatchEntry& e = batch.entries[i];
    if (batch.input.return_routing) RecordRouting(e, *sampled, token);
    token += e.count;
    ProcessEntry(e, &sampled->entries[i], now_us);
  }
  RemoveFinished(/*include_waiting=*/false);
}

void Scheduler::RecordRouting(const BatchEntry& e, const SampledBatch& out,
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

void Scheduler::FailBatch(const ScheduledBatch& batch, const absl::Status& error,
                          int64_t now_us) {
  for (const BatchEntry& e : batch.entries) {
    Finish(e.seq,
           FinishReason{FinishKind::kAbort, -1, "",
                        absl::StrCat("model forward failed: ", error.ToString())},
           /*cache_kv=*/false, now_us);
  }
  RemoveFinished(/*include_waiting=*/false);
}

void Scheduler::Finish(Sequence* seq, FinishReason reason, bool cache_kv, int64_t now_us) {
  ReleaseKv(seq, cache_kv);
  seq->finished = true;
  finished_.push_back(seq);
  if (reason.kind == FinishKind::kAbort) {
    ++num_aborted_;
  }
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
  result.weight_version = seq->version_segments.empty()
                              ? weight_version_
                              : seq->version_segments.back().weight_version;
  result.dispatch_weight_version = seq->dispatch_version;
  result.weight_version_segments = std::move(seq->version_segments);
  if (seq->request().return_routed_experts) {
    result.routed_experts = std::move(seq->routed_experts);
    result.expert_weights = std::move(seq->expert_weights);
    result.routed_experts_start = seq->request().routed_experts_start_len;
    result.routed_num_layers = static_cast<int32_t>(options_.routing_layers);
    result.routed_top_k = static_cast<int32_t>(options_.routing_top_k);
  }
  const int64_t submit = seq->group->submit_us;
  result.timings.queue_us = seq->first_scheduled_us < 0 ? now_us - submit
                                                        : seq->first_scheduled_us - submit;
  result.timings.ttft_us = seq->first_token_us < 0 ? 0 : seq->first_token_us - submit;
  result.timings.total_us = now_us - submit;
  if (seq->group->callbacks.on_finish) seq->group->callbacks.on_finish(std::move(result));
}

void Scheduler::RemoveFinished(bool include_waiting) {
  if (finished_.empty()) return;
  auto done = [](const std::unique_ptr<Sequence>& s) { return s->finished; };
  const size_t before = running_.size();
  running_.erase(std::remove_if(running_.begin(), running_.end(), done), running_.end());
  if (running_.size() != before) ++running_epoch_;
  if (include_waiting) {
    waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), done), waiting_.end());
  }
  finished_.clear();
}

int32_t Scheduler::Abort(const std::string& id, const std::string& message, int64_t now_us) {
  int32_t count = 0;
  auto visit = [&](const std::unique_ptr<Sequence>& s) {
    if (s->finished || s->request().id != id) return;
    Finish(s.get(), FinishReason{FinishKind::kAbort, -1, "", message}, /*cache_kv=*/true,
           now_us);
    ++count;
  };
  for (const auto& s : running_) visit(s);
  for (const auto& s : waiting_) visit(s);
  RemoveFinished(/*include_waiting=*/true);
  return count;
}

int32_t Scheduler::AbortAll(const std::string& message, int64_t now_us) {
  int32_t count = 0;
  auto visit = [&](const std::unique_ptr<Sequence>& s) {
    if (s->finished) return;
    Finish(s.get(), FinishReason{FinishKind::kAbort, -1, "", message}, /*cache_kv=*/true,
           now_us);
    ++count;
  };
  for (const auto& s : running_) visit(s);
  for (const auto& s : waiting_) visit(s);
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
  st.total_kv_tokens = pool_.total_tokens();
  st.available_kv_tokens = pool_.available_tokens();
  st.evictable_kv_tokens = tree_.evictable_tokens();
  st.tree_cache_tokens = tree_.cached_tokens();
  st.tree_cache_nodes = tree_.num_nodes();
  st.req_to_token_used = req_to_token_.num_used();
  st.req_to_token_total = req_to_token_.num_rows();
  st.forward_ct_decode = forward_ct_decode_;
  st.new_token_ratio = new_token_ratio_;
  st.num_finished = num_finished_;
  st.num_aborted = num_aborted_;
  st.num_retractions = num_retractions_;
  st.cache_hit_tokens = cache_hit_tokens_;
  st.prompt_tokens = prompt_tokens_;
  st.generated_tokens = generated_tokens_;
  return st;
}

absl::Status Scheduler::CheckInvariants() const {
  const int32_t ps = options_.page_size;
  int64_t own = 0;
  for (const auto& s : running_) {
    if (s->row < 0) return absl::InternalError(absl::StrCat(s->request().id, " has no row"));
    if (s->cached_len > s->num_computed || s->num_computed > s->num_allocated ||
        s->cached_len % ps != 0) {
      return absl::InternalError(absl::StrCat(s->request().id, " has inconsistent KV lengths"));
    }
    own += CeilDiv(s->num_allocated, ps) - s->cached_len / ps;
  }
  for (const auto& s : waiting_) {
    if (s->row >= 0 || s->last_node != nullptr) {
      return absl::InternalError(absl::StrCat(s->request().id, " waits while holding KV"));
    }
  }
  const int64_t tree_pages = tree_.cached_tokens() / ps;
  if (pool_.num_free_pages() + tree_pages + own != pool_.num_pages()) {
    return absl::InternalError(absl::StrCat("page leak: free ", pool_.num_free_pages(),
                                            " + cached ", tree_pages, " + owned ", own,
                                            " != total ", pool_.num_pages()));
  }
  if (req_to_token_.num_used() != static_cast<int32_t>(running_.size())) {
    return absl::InternalError(absl::StrCat("req_to_token leak: ", req_to_token_.num_used(),
                                            " rows used by ", running_.size(), " sequences"));
  }
  return absl::OkStatus();
}

}  // namespace rl::engine
