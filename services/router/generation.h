// Generation: the domain logic of one routed Router.Generate, apart from gRPC streams and
// threads, so any driver (the router's callback reactor, a test) steps it the same way. Create
// resolves the prompt (through the text cache) and registers the request id; the driver then
// calls Next() and does what the Step says (kCall a leased worker, kWait, kDone), feeding the
// worker's messages to OnMessage. Failures before any output are retried on another worker with
// backoff; a hold by an admin broadcast is waited out, not counted as an attempt, and so is the
// wait of a request for a worker at a weight version it accepts (docs/weight-updates.md,
// "Versions a request accepts"); the final's
// trajectory is inserted into the text cache. docs/routing.md ("Attempts and retries") has the
// rules in full.
// docs/life-of-a-request.md follows one request through every layer, with file names.
//
// Not thread-safe: one driver steps it, one call at a time (calls may come from different
// threads when ordered by the driver). Cost per message: the stream decode of its tokens.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "common/request_limits.h"
#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "common/version_constraint.h"
#include "rl/v1/router.pb.h"
#include "rl/v1/worker.pb.h"
#include "services/router/cache/prompt_resolver.h"
#include "services/router/cache/text_cache.h"
#include "services/router/episodes/episode_store.h"
#include "services/router/pool/worker_pool.h"
#include "services/router/request_table.h"
#include "services/router/resume_store.h"

namespace rl::router {

// Text prompts longer than this are tokenized off gRPC's callback threads.
inline constexpr size_t kInlinePromptBytes = 2048;
// Longest routing_key / group_id accepted (docs/routing.md, "Policies").
inline constexpr size_t kMaxRoutingKeyBytes = 256;
// The worker's max_new_tokens when a request sets none (services/worker/proto_convert.h): a
// kept partial sample (ResumeStore) records it as its original budget.
inline constexpr int32_t kWorkerDefaultMaxNewTokens = 128;

struct RetryOptions {
  int max_attempts = 3;
  std::chrono::milliseconds backoff{50};
  std::chrono::milliseconds max_backoff{2000};
  std::chrono::milliseconds hold_wait{300000};
  std::chrono::milliseconds hold_poll{20};
  // A request that accepts only some weight versions (min/exact_weight_version) and finds no
  // routable worker serving one waits for one this long at most (less when its own deadline is
  // sooner), polling every version_poll; then UNAVAILABLE naming the versions.
  std::chrono::milliseconds version_wait{30000};
  std::chrono::milliseconds version_poll{20};
};

// What every generation shares; pointers outlive the generations. `retries_total` may be null.
struct GenerationEnv {
  WorkerSource* workers = nullptr;
  TextCache* cache = nullptr;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  SeamCounters* seam_counters = nullptr;
  RequestTable* requests = nullptr;
  RequestLimits limits;
  RetryOptions retry;
  Counter* retries_total = nullptr;
  // Called with a worker's address and a finished completion's prompt and cached tokens (its
  // prefix-cache hits as it reports them); may be empty.
  std::function<void(const std::string&, int64_t, int64_t)> record_prefix;
  // Where completions of requests that name an episode are recorded (null: not recorded).
  EpisodeStore* episodes = nullptr;
  Counter* history_unknown_total = nullptr;  // answers with cache_history_unknown; may be null
  // The fleet's staleness bound (--max-version-lag), sent with requests that set none; -1: none.
  int32_t max_version_lag = -1;
  // Partial samples kept for a resume by request id (null: none kept, resume by id refused).
  ResumeStore* resume_store = nullptr;
};

// The prompt as the model will see it: cached tokens reused exactly plus the new ones.
// input_ids prompts fill `ids` only.
struct Prompt : ResolvedPrompt {
  bool from_text = false;
};

class Generation {
 public:
  struct Step {
    enum class Kind { kCall, kWait, kDone };
    Kind kind = Kind::kDone;
    Worker* worker = nullptr;           // kCall: the worker to call (leased until EndAttempt)
    std::chrono::milliseconds wait{0};  // kWait: call Next() again after this
    absl::Status status;                // kDone
  };

  // The checks that need no tokenizer: the --max-* limits and the reserved request id prefix.
  static absl::Status CheckRequest(const rl::v1::GenerateRequest& request,
                                   const RequestLimits& limits);
  // A request's id in the router's table of requests in flight, taken before admission so that
  // Router.Abort (one id or abort_all) reaches it while it waits in the admission queue too.
  struct Registration {
    std::string request_id;  // the client's, or one the router made up
    RequestTable::Handle handle;
  };
  static Registration Register(const rl::v1::GenerateRequest& request, RequestTable* requests);

  // Checks `request` (CheckRequest, unless it comes `registered`: checked then), resolves its
  // prompt; InvalidArgument / FailedPrecondition naming the problem. Blocks for the
  // tokenization of a text prompt (O(prompt bytes)). Without `registered` it registers itself.
  static absl::StatusOr<std::unique_ptr<Generation>> Create(const rl::v1::GenerateRequest& request,
                                                            const GenerationEnv* env,
                                                            Registration* registered = nullptr);
  // True when resolving `request`'s prompt is worth running off a callback thread.
  static bool PromptBlocks(const rl::v1::GenerateRequest& request);

  const std::string& request_id() const { return request_id_; }
  const Prompt& prompt() const { return prompt_; }
  // Whether anything was handed to the client (no retry after that).
  bool sent_any() const { return sent_any_; }

  // What to do next (see the header comment). After kDone, Next() returns the same again.
  Step Next();

  // kCall: the request for the leased worker (input ids, logprobs on, streaming, the request
  // id); starts the attempt (its decoders) and tells the RequestTable where the request runs.
  rl::v1::GenerateRequest WorkerRequest();
  // Whether OnMessage(msg) runs a cache insert (a final of a text prompt).
  bool FinalBlocks(const rl::v1::GenerateResponse& msg) const;
  // One worker response: appends what the client gets to `out` (none, one, or a text tail and
  // the final). Returns false when the attempt should stop now (the worker aborted the request
  // before any output: cancel the call, it is retried).
  bool OnMessage(rl::v1::GenerateResponse msg, std::vector<rl::v1::GenerateResponse>* out);
  // The worker call ended with `status`; `pool_reason` is set when the pool cancelled it
  // (the worker was marked dead). kDone when the generation is over, else Next() goes on.
  void EndAttempt(const absl::Status& status, std::optional<std::string> pool_reason);
  // After OnMessage: the text cache store's ticket that must be durable before the messages it
  // appended are sent (cache_store.h WhenDurable), or 0 when there is nothing to wait for.
  // Taking it resets it.
  uint64_t TakeDurableTicket() { return std::exchange(durable_ticket_, 0); }
  // The client went away: Next() returns kDone CANCELLED. Thread-safe (any thread, any time).
  void Cancel() { cancelled_.store(true); }
  // The client's deadline (gRPC's; infinite when none): a version-constrained request waits for
  // a qualifying worker until shortly before it at most (a quarter of the time left, at most
  // 1 s, is kept for the answer to arrive). Call before the first Next().
  void SetDeadline(std::chrono::system_clock::time_point deadline);

 private:
  Generation(const rl::v1::GenerateRequest& request, const GenerationEnv* env)
      : env_(env), request_(request) {}
  Lease PickWorker();
  void CompleteFinal(size_t index, rl::v1::GenerateFinal* f);

  // Resume (generation_resume.cc; docs/weight-updates.md, "Resume").
  struct Completion;
  // The request to run: `request` itself, or for a resume by request id the kept prompt,
  // sampling params and earlier output (ResumeStore) under this request's other fields.
  static absl::StatusOr<rl::v1::GenerateRequest> ResolveResume(
      const rl::v1::GenerateRequest& request, ResumeStore* store);
  // The ResumeStore key of completion `index` of an n-sample request ("ID", or "ID#index").
  static std::string ResumeKey(const std::string& request_id, int index, int n);
  // A resume: the earlier output joins the completion's text (the decoder's context), unstreamed.
  void PrimeResumed(Completion* c) const;
  // A final: marks a resume by id (and forgets the kept sample); keeps an ABORT/STALE partial.
  void OnResumeFinal(size_t index, rl::v1::GenerateFinal* f);

  struct Completion {
    std::optional<tokenizer::StreamDecoder> decoder;
    std::string text;            // completion text decoded in the prompt's context
    std::vector<uint32_t> ends;  // per output token, byte end within `text`
    size_t streamed_bytes = 0;
  };
  enum class Phase { kStartAttempt, kPick, kInCall, kDone };

  const GenerationEnv* env_;
  const rl::v1::GenerateRequest request_;
  std::string resumed_from_id_;  // a resume by request id: the kept sample's id
  const VersionConstraint versions_ = VersionConstraintOf(request_);
  Prompt prompt_;
  std::string request_id_;  // the client's, or one the router made up
  RequestTable::Handle request_handle_;

  Phase phase_ = Phase::kStartAttempt;
  std::atomic<bool> cancelled_{false};
  bool sent_any_ = false;
  int attempt_ = 0;
  std::set<std::string> tried_;
  std::chrono::milliseconds backoff_{0};
  std::chrono::milliseconds hold_poll_{0};  // doubles per poll of one hold, up to 8x
  std::chrono::steady_clock::time_point hold_deadline_;
  std::chrono::steady_clock::time_point version_deadline_;  // see RetryOptions::version_wait
  std::chrono::milliseconds version_poll_{0};
  absl::Status last_;
  absl::Status done_status_;
  // The prompt's prefix holders as the routing policy sees them (views into prompt_).
  std::vector<PrefixHolder> holders_;
  // The current attempt.
  Lease lease_;
  std::vector<Completion> completions_;
  size_t num_finals_ = 0;
  bool aborted_before_output_ = false;
  uint64_t durable_ticket_ = 0;
};

}  // namespace rl::router
