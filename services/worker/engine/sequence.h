// Sequence: the engine-internal state of one completion (a request with n > 1 has n of them,
// sharing one RequestGroup). Owned by the scheduler; touched only on the engine thread.
//
// KV layout of a sequence holding a req_to_token row: positions [0, cached_len) use pages owned
// by the radix cache (pinned by the lock on last_node); positions [cached_len, num_allocated)
// use pages the sequence owns; positions [0, num_computed) have their KV written.
// Invariant: cached_len <= num_computed <= num_allocated <= tokens.size(), cached_len is
// page-aligned, and a sequence in the waiting queue holds no row, page or lock.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "services/worker/engine/radix_cache.h"
#include "services/worker/engine/request.h"
#include "services/worker/engine/text_decoder.h"

namespace rl::engine {

// What the n completions of one request share.
struct RequestGroup {
  GenerateRequest request;
  RequestCallbacks callbacks;
  int64_t submit_us = 0;  // steady clock
};

struct Sequence {
  std::shared_ptr<RequestGroup> group;
  int32_t index = 0;
  uint64_t seed = 0;
  int32_t prompt_len = 0;
  std::vector<int32_t> tokens;  // prompt followed by the completion so far

  // Outputs.
  std::vector<TokenLogprob> output_logprobs;
  int64_t dispatch_version = 0;                  // engine weight version when added
  std::vector<VersionSegment> version_segments;  // run-length version of each output token
  std::vector<TokenLogprob> prompt_logprobs;
  absl::flat_hash_map<int32_t, int32_t> output_counts;
  bool prompt_logprobs_done = false;
  // Stop strings: the completion's text so far, a token at a time (created at the first output
  // token), and its recent tail that a stop string may still end in (OutputProcessor).
  std::unique_ptr<TextDecoder::Stream> stop_stream;
  std::string stop_tail;
  // R3: routing of positions [routed_experts_start_len, routing_next), kept across retractions.
  std::vector<int32_t> routed_experts;
  std::vector<float> expert_weights;
  int64_t routing_next = 0;

  // KV state (see the header comment).
  int32_t row = -1;
  int64_t cached_len = 0;
  int64_t num_computed = 0;
  int64_t num_allocated = 0;
  RadixCache::Node* last_node = nullptr;
  int64_t kv_version = 0;
  // An in-flight update kept this sequence's KV (Scheduler::KeepKvThroughUpdate): the KV it
  // holds mixes versions, so it is never inserted into the prefix cache.
  bool kv_from_older_version = false;
  int64_t oldest_kv_version = 0;
  // Resolved staleness bound (-1: none) and whether the version moved past it.
  int64_t max_version_lag = -1;

  // Bookkeeping.
  int32_t cached_tokens = -1;  // prefix-cache hit at first admission; -1 before
  int32_t num_retractions = 0;
  int64_t first_scheduled_us = -1;
  int64_t first_token_us = -1;
  bool finished = false;

  const GenerateRequest& request() const { return group->request; }
  const SamplingParams& params() const { return group->request.sampling; }
  int32_t output_len() const { return static_cast<int32_t>(tokens.size()) - prompt_len; }
  // Tokens known but not yet in the KV cache (>= 1 for a running sequence).
  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - num_computed; }
};

}  // namespace rl::engine
