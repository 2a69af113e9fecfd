// Request limits: every size a client controls is checked against a configured bound before it
// costs memory or time (before tokenization, before any per-sample allocation). Shared by
// rl-worker and rl-router; each limit is a command-line flag with a sane default, and an error
// names the field, the value and the flag (`n: 2147483647 is more than --max-n (64)`). The code is
// INVALID_ARGUMENT, except RESOURCE_EXHAUSTED for max_new_tokens over its limit or the context.
//
// Errors never echo unbounded input: text a client sent is quoted through QuoteForError, which
// keeps at most a few dozen bytes (and its size).
// Cost: O(number of stop strings + ids) per check; no allocation proportional to the input.
// Thread-safe (plain values).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "rl/v1/admin.pb.h"
#include "rl/v1/generate.pb.h"

namespace rl {

class FlagSet;

struct RequestLimits {
  int64_t max_n = 64;                            // --max-n: samples per request
  int64_t max_prompt_bytes = 4 << 20;            // --max-prompt-bytes: text prompt size
  int64_t max_prompt_tokens = 131072;            // --max-prompt-tokens: ids sent or tokenized
  int64_t max_new_tokens = 131072;               // --max-new-tokens-limit (worker: also <= context)
  int64_t max_stop_strings = 32;                 // --max-stop-strings
  int64_t max_stop_string_bytes = 256;           // --max-stop-string-bytes: each stop string
  int64_t max_stop_token_ids = 256;              // --max-stop-token-ids
  int64_t max_top_logprobs = 20;                 // --max-top-logprobs
  int64_t max_request_id_bytes = 256;            // --max-request-id-bytes
  int64_t max_tensor_chunk_bytes = 256 << 20;    // --max-tensor-chunk-bytes: one chunk's data
  int64_t max_update_bytes = int64_t{64} << 30;  // --max-update-bytes: one tensor update
  int64_t max_tensor_rank = 8;                   // --max-tensor-rank
  int64_t max_address_bytes = 256;               // --max-address-bytes: AddWorker & co.
  int64_t max_path_bytes = 4096;                 // --max-path-bytes: UpdateWeightsFromDisk path
};

// Declares the --max-* flags above on `flags`, bound to `limits` (one call in each main.cc).
void RegisterRequestLimitFlags(FlagSet& flags, RequestLimits* limits);
// InvalidArgument naming the first flag out of its sane range.
absl::Status ValidateRequestLimits(const RequestLimits& limits);

// `s` for an error message: at most `max_bytes` bytes of it (cut on a UTF-8 boundary, control
// bytes escaped), quoted, with its full size when cut: 'abc…' (52428800 bytes).
std::string QuoteForError(absl::string_view s, size_t max_bytes = 48);

// Checks every client-sized field of a Generate request (request_id, text bytes, ids count,
// n, max_new_tokens, stop strings and ids, top_logprobs_num). `context_len` > 0 also bounds
// max_new_tokens (the worker passes its model's context). No tokenization, no allocation.
absl::Status CheckGenerateRequest(const rl::v1::GenerateRequest& request,
                                  const RequestLimits& limits, int64_t context_len = 0);
// Server-assigned request ids live in their own namespace: "srv-" followed by 128 random bits
// (hex), so they can neither be guessed nor collide with a client's ids; a client id with that
// prefix is refused by CheckGenerateRequest.
inline constexpr char kServerRequestIdPrefix[] = "srv-";
// Ids the router makes up for requests that carry none: "rtr-" + 128 random bits; the router
// refuses client ids with that prefix (the worker accepts them: the router is its client).
inline constexpr char kRouterRequestIdPrefix[] = "rtr-";
std::string NewServerRequestId(absl::string_view prefix = kServerRequestIdPrefix);

// After tokenization (or for input_ids): the prompt's token count.
absl::Status CheckPromptTokens(int64_t num_tokens, const RequestLimits& limits);
// A worker address (AddWorker / RemoveWorker / SetWorkerEnabled).
absl::Status CheckAddress(absl::string_view address, const RequestLimits& limits);
// A folder path (UpdateWeightsFromDisk.model_path).
absl::Status CheckPath(absl::string_view field, absl::string_view path,
                       const RequestLimits& limits);

// Header of one tensor chunk: name, dtype, shape (rank and element count with checked
// arithmetic, byte size at most --max-update-bytes) and data size. On success `*num_bytes` is
// the whole tensor's byte size.
absl::Status CheckTensorChunk(const rl::v1::TensorChunk& chunk, const RequestLimits& limits,
                              int64_t* num_bytes);
// The element count of `shape` with checked arithmetic: InvalidArgument on a negative
// dimension, a rank above `max_rank`, or a product above 2^62.
absl::Status CheckedNumElements(absl::Span<const int64_t> shape, int64_t max_rank, int64_t* out);

}  // namespace rl
