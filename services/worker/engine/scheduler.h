// Scheduler: continuous batching over a paged KV pool with a radix prefix cache. Pure CPU
// policy: no tensors, no protobuf, no threads. One engine step is
//
//   ScheduledBatch batch = scheduler.Schedule();
//   runner.Forward(batch.input, &out);
//   sampler.Sample(batch, &out, &sampled);
//   scheduler.Update(batch, &sampled);
//
// Schedule() gives every running sequence with one uncomputed token (decode) a slot first,
// retracting the newest running sequences back to the waiting queue when KV runs out (their
// pages are freed; they are prefilled again later, prompt + tokens so far). Then it continues
// chunked prefills and admits waiting sequences FCFS within a per-step prefill token budget,
// a req_to_token row limit and a KV reservation for future decode tokens (new_token_ratio).
// A waiting sequence whose prefix is being prefilled by another sequence right now waits one
// step so it reuses that prefix from the cache (this is how n > 1 forks the prompt's KV).
// Before any of that, a request whose accepted weight versions (GenerateRequest::versions) do
// not include the current one finishes with kAbort: no step runs it on other weights; one the
// version moved more than its max_version_lag past its dispatch version finishes with kStale.
// While held (a drain pause), new requests wait in a held queue the scheduler never admits
// from; Release moves them behind the waiting ones.
// Update() applies the sampled tokens, streams outputs, and finishes sequences on EOS / stop
// ids / stop strings / max_new_tokens, returning their KV to the radix cache.
//
// Invariant (checked by CheckInvariants): free pages + radix-cache pages + pages owned by
// running sequences == all pages, and rows in use == running sequences.
// Thread safety: none; owned by the engine thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/worker/engine/batch.h"
#include "services/worker/engine/kv_cache_manager.h"
#include "services/worker/engine/output_processor.h"
#include "services/worker/engine/request.h"
#include "services/worker/engine/sequence.h"
#include "services/worker/engine/text_decoder.h"

namespace rl::engine {

struct SchedulerOptions {
  int64_t num_kv_slots = 0;
  int32_t page_size = 1;
  int64_t max_context_len = 0;
  std::vector<int32_t> eos_token_ids;
  // Most sequences holding KV at once (req_to_token rows).
  int32_t max_running_requests = 256;
  // Most prefill tokens per step (decode tokens are not counted).
  int32_t chunked_prefill_size = 2048;
  // Fraction of a running sequence's remaining max_new_tokens reserved when admitting: starts
  // at init, decays linearly to min over decay_steps decode steps, rises after a retraction.
  double init_new_token_ratio = 0.7;
  double min_new_token_ratio = 0.1;
  int32_t new_token_ratio_decay_steps = 600;
  // Routing values per token in ForwardOutput::routed_experts (MoE layers · top_k; 0: the
  // runner exports no routing and no request asks for it).
  int64_t routing_width = 0;
  int64_t routing_layers = 0;  // routing_width = routing_layers · routing_top_k
  int64_t routing_top_k = 0;
  // Staleness bound for requests that set none (-1: none).
  int64_t default_max_version_lag = -1;
};

// Counters only: O(1) to copy whatever the batch size (the running ids are RunningIds()).
struct SchedulerStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t num_held = 0;  // arrived during a drain pause; not in num_waiting
  int64_t total_kv_tokens = 0;
  int64_t available_kv_tokens = 0;  // free pages * page_size
  int64_t evictable_kv_tokens = 0;  // cached and not locked
  int64_t tree_cache_tokens = 0;
  int64_t tree_cache_nodes = 0;
  int32_t req_to_token_used = 0;
  int32_t req_to_token_total = 0;
  bool has_chunked_prefill = false;
  int64_t forward_ct_decode = 0;
  double new_token_ratio = 0;
  int64_t num_finished = 0;
  int64_t num_aborted = 0;
  int64_t num_stale = 0;
  int64_t num_retractions = 0;
  int64_t cache_hit_tokens = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, const TextDecoder* decoder);

  // Queues the n completions of a request (already validated). `seed` is used when the
  // request has none.
  void Add(std::shared_ptr<RequestGroup> group, uint64_t seed);

  bool HasWork() const { return !running_.empty() || !waiting_.empty(); }
  bool HasRunning() const { return !running_.empty(); }
  bool HasWaiting() const { return !waiting_.empty(); }
  bool HasHeld() const { return !held_.empty(); }

  // Drain pause: while held, Add queues new requests in the held queue (never admitted, not
  // counted as waiting: an update or a flush does not wait for them); Hold(false) moves them
  // behind the waiting queue, in arrival order.
  void Hold(bool hold);
  bool holding() const { return hold_new_; }

  // Picks the next step's work and allocates its KV. Empty only when there is no work.
  ScheduledBatch Schedule(int64_t now_us);
  // Applies the sampling stage's result for `batch` (its prompt logprobs and routing are moved
  // out): appends tokens, streams, finishes.
  void Update(const ScheduledBatch& batch, SampledBatch* sampled, int64_t now_us);
  // The forward pass failed: every sequence of `batch` finishes with kAbort and `error`, its
  // KV (now unspecified) freed without caching.
  void FailBatch(const ScheduledBatch& batch, const absl::Status& error, int64_t now_us);

  // Finishes the completions of request `id` (waiting or running) with kAbort. Returns how
  // many completions were aborted.
  int32_t Abort(const std::string& id, const std::string& message, int64_t now_us);
  int32_t AbortAll(const std::string& message, int64_t now_us);
  // Moves every running sequence back to the front of the waiting queue (oldest first) and
  // frees its KV.
  void RetractAll();
  // Empties the radix cache, KV pool and req_to_token table and resets counters. Requires no
  // running sequence (waiting ones survive and are recomputed).
  absl::Status Flush();
  // An in-flight update (keep_kv) replaced the weights under the running sequences: they keep
  // their KV (computed by older weights) and go on with the new ones. Marks every running
  // sequence that holds KV (its result says so; its KV, of mixed versions, is never cached)
  // and evicts every unlocked prefix of the cache (stale KV is never reused). Returns how many
  // sequences kept their KV. Call after set_weight_version.
  int32_t KeepKvThroughUpdate();

  void set_weight_version(int64_t version) { weight_version_ = version; }
  int64_t weight_version() const { return weight_version_; }

  SchedulerStats Stats() const;
  // "id" or "id#index" of every running sequence, admission order. O(running).
  std::vector<std::string> RunningIds() const;
  // Changes whenever a sequence joins or leaves the running batch: RunningIds() is the same
  // list as long as it does not.
  int64_t running_epoch() const { return running_epoch_; }
  // The KV bookkeeping (the engine reads KV events and snapshots from it).
  KvCacheManager& kv() { return kv_; }
  // OK when the page accounting invariant holds; INTERNAL naming the mismatch otherwise.
  absl::Status CheckInvariants() const;

 private:
  // Finishes with kAbort every sequence whose request does not accept weight_version_, and with
  // kStale every one the version moved more than its max_version_lag past.
  void EnforceVersions(int64_t now_us);

  // A resume (GenerateRequest::resumed_ids): the earlier output joins the new sequence.
  void AddResumed(Sequence* seq);

  // Retraction.
  void Retract(std::unique_ptr<Sequence> seq);
  void RetractNewest();

  // Scheduling helpers.
  int64_t MatchLimit(const Sequence& seq) const;
  bool PrefixInFlight(const Sequence& seq, int64_t matched,
                      const std::vector<const Sequence*>& in_flight) const;
  int64_t ReservedTokens() const;
  bool TryAdmit(Sequence* seq, int64_t budget, int64_t* chunk);
  ScheduledBatch BuildOnce(int64_t now_us);
  void AddEntry(ScheduledBatch* batch, Sequence* seq, int64_t count);

  // Output helpers.
  void ProcessEntry(const BatchEntry& entry, SampledEntry* sampled, int64_t now_us);
  void Finish(Sequence* seq, FinishReason reason, bool cache_kv, int64_t now_us);
  // Drops finished sequences from the running batch (and the waiting and held queues when
  // asked).
  void RemoveFinished(bool include_waiting);

  SchedulerOptions options_;
  KvCacheManager kv_;
  OutputProcessor output_;

  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::deque<std::unique_ptr<Sequence>> held_;  // arrived while hold_new_ (drain pause)
  bool hold_new_ = false;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order: newest last
  std::vector<Sequence*> finished_;                 // finished during the current call
  int64_t running_epoch_ = 0;
  int64_t weight_version_ = 0;
  // The version EnforceVersions last ran for, and whether a constrained request came since.
  int64_t versions_checked_ = 0;
  bool versions_unchecked_ = false;

  double new_token_ratio_;
  double new_token_ratio_decay_;
  int64_t forward_ct_decode_ = 0;
  int64_t num_retractions_ = 0;
  int64_t cache_hit_tokens_ = 0;
  int64_t prompt_tokens_ = 0;
};

}  // namespace rl::engine
