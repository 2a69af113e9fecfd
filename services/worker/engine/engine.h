// Engine: one model replica's generation loop. It owns a ModelRunner and a Scheduler and runs
// them on a single engine thread:
//
//   loop: run queued commands → batch = scheduler.Schedule() → runner.Forward(batch)
//         → sampler.Sample(batch, logits) → scheduler.Update(batch, tokens)
//         → publish the step's KV events (while subscribed) and a ServerInfo snapshot
//
// Every public method may be called from any thread: commands reach the engine thread through a
// mutex + condition-variable queue, and the blocking ones return once it applied them, between
// two steps. Request callbacks run on the engine thread and must not block. Pause modes and
// FlushCache follow DESIGN.md's control-plane semantics; docs/life-of-a-request.md follows a
// request through the loop. Cost: a blocking command waits for at most the forward pass in
// flight.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model_io/model_config.h"
#include "services/worker/engine/kv_events.h"
#include "services/worker/engine/request.h"
#include "services/worker/engine/sampler.h"
#include "services/worker/engine/scheduler.h"
#include "services/worker/engine/text_decoder.h"
#include "services/worker/model/model_runner.h"

namespace rl::engine {

// Ordered by strength: a pause with a stronger mode overrides a weaker one. kDrain keeps
// stepping what was admitted before it and holds what arrives after it.
enum class PauseMode { kNone = 0, kDrain = 1, kInPlace = 2, kRetract = 3, kAbort = 4 };

const char* PauseModeName(PauseMode mode);

struct EngineOptions {
  // Batching and admission (max_running_requests, chunked_prefill_size, new_token_ratio). The
  // engine sets the fields that come from the runner and the model itself: num_kv_slots,
  // page_size, max_context_len, eos_token_ids and routing_*.
  SchedulerOptions scheduler;
  // Most requests in flight (waiting + running); Submit beyond is RESOURCE_EXHAUSTED.
  int32_t max_queued_requests = 65536;
  int64_t initial_weight_version = 0;
  // Verify the KV page accounting after every step (tests); a violation is reported in
  // ServerInfo::invariant_error.
  bool check_invariants = false;
  // Allow return_routed_experts (R3) on MoE models (--enable-return-routed-experts).
  bool enable_return_routed_experts = false;
  // KV events (kv_events.h): tokens + hashes buffered for subscribers at most, and how many may
  // subscribe at once.
  int64_t kv_event_buffer_units = int64_t{1} << 22;
  int32_t max_kv_event_subscribers = 16;
};

// What a drain pause left (Engine::Drain).
struct DrainResult {
  // Nothing admitted before the pause runs or waits any more.
  bool drained = false;
  int32_t num_still_active = 0;               // running + waiting when the call returned
  std::vector<std::string> still_active_ids;  // the running ones' ids, at most kMaxDrainIds
  int32_t num_held = 0;                       // arrived during the drain; wait for Continue
  static constexpr size_t kMaxDrainIds = 64;
};

// A snapshot of the engine, published by the engine thread after every step and command.
// Publishing copies the counters; running_ids is rebuilt only when a sequence joined or left
// the running batch (so a decode step with nothing admitted or finished copies no string).
struct ServerInfo {
  bool paused = false;
  PauseMode pause_mode = PauseMode::kNone;
  std::string backend;
  SchedulerStats scheduler;  // queues, KV and req_to_token usage, token and request counters
  std::vector<std::string> running_ids;  // "id" or "id#index" for completions of n > 1
  int64_t num_steps = 0;
  int64_t weight_version = 0;
  std::string invariant_error;  // with EngineOptions::check_invariants
};

class Engine;

// What RunOnEngineThread's function may do. Valid only during that call, on the engine
// thread. A weight update reads: Pause(kRetract or kAbort) → swap weights in runner() or
// ReplaceRunner → FlushCache → set_weight_version → Continue.
class EngineContext {
 public:
  model::ModelRunner& runner();
  // Swaps in a runner with the same vocabulary, KV slots and page size, then flushes the
  // cache (the old KV is gone). FAILED_PRECONDITION while a request is running.
  absl::Status ReplaceRunner(std::unique_ptr<model::ModelRunner> runner);
  void Pause(PauseMode mode);
  void Continue();
  absl::Status FlushCache();
  // In-flight update (keep_kv): after the weights changed under running sequences, keep their
  // KV instead of a flush (Scheduler::KeepKvThroughUpdate). Returns how many kept KV.
  int32_t KeepKvThroughUpdate();
  int32_t AbortAll(const std::string& message);
  bool paused() const;
  PauseMode pause_mode() const;
  bool has_running() const;
  bool has_waiting() const;
  int64_t weight_version() const;
  void set_weight_version(int64_t version);
  ServerInfo info() const;
  // OK when the KV page and req_to_token accounting is consistent (tests, debugging).
  absl::Status CheckInvariants() const;

 private:
  friend class Engine;
  explicit EngineContext(Engine* engine) : engine_(engine) {}
  Engine* engine_;
};

class Engine {
 public:
  // Starts the engine thread. `decoder` may be null (then stop strings are rejected).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      std::unique_ptr<model::ModelRunner> runner, const EngineOptions& options,
      std::unique_ptr<TextDecoder> decoder = nullptr);
  // Finishes every request with kAbort ("engine shutting down") and joins the thread.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. On OK, callbacks.on_finish runs exactly once per
  // completion; on error no callback runs. ALREADY_EXISTS for an id in flight,
  // RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE after shutdown began.
  absl::Status Submit(GenerateRequest request, RequestCallbacks callbacks);
  // Finishes request `id` (all its completions) with kAbort. Returns the number of
  // completions aborted (0 for an unknown or finished id).
  absl::StatusOr<int32_t> Abort(const std::string& id, const std::string& message = "aborted");
  // Like Abort but returns at once (e.g. from a gRPC OnCancel).
  void AbortAsync(const std::string& id, const std::string& message = "aborted");
  absl::StatusOr<int32_t> AbortAll(const std::string& message = "aborted");
  // kAbort finishes every waiting and running request with kAbort; kInPlace stops scheduling
  // and keeps the KV; kRetract moves running requests back to the waiting queue and frees their
  // KV (prefilled again on Continue). A paused engine keeps the stronger mode (in_place <
  // retract < abort); requests submitted while paused wait. kDrain keeps stepping what was
  // submitted before it (running and waiting) and holds what is submitted after it (bounded by
  // max_queued_requests; an abort or a cancel ends a held request like any other) until
  // Continue; use Drain to wait for it.
  absl::Status Pause(PauseMode mode);
  // Pause(kDrain), then waits until nothing admitted before it runs or waits, the engine
  // leaves the drain (Continue, a stronger pause) or `timeout` passed. Never waits when a
  // stronger pause was in force already (nothing would drain).
  absl::StatusOr<DrainResult> Drain(absl::Duration timeout);
  absl::Status Continue();
  // FAILED_PRECONDITION while a request runs or waits, unless paused with retract (or abort):
  // then the waiting requests survive and are recomputed.
  absl::Status FlushCache();
  // Blocking commands (Pause, Continue, FlushCache, Abort, AbortAll, RunOnEngineThread,
  // SetWeightVersion) refuse to run on the engine thread itself (a request callback calling one
  // would deadlock): FAILED_PRECONDITION.
  // Runs `fn` on the engine thread between two steps and returns its status.
  absl::Status RunOnEngineThread(std::function<absl::Status(EngineContext&)> fn);

  int64_t weight_version() const { return weight_version_.load(); }
  absl::Status SetWeightVersion(int64_t version);
  // Blocking commands run on the engine thread so far (each is one hop between two steps): how
  // many times an operation held the engine (tests: an activation is one).
  int64_t num_commands() const { return num_commands_.load(); }
  // Non-blocking: the snapshot published after the latest step or command.
  ServerInfo GetServerInfo() const;
  // The snapshot's `paused`, without copying the snapshot (a per-request door check).
  bool published_paused() const { return published_paused_.load(std::memory_order_acquire); }
  // Requests accepted by Submit whose last completion has not been delivered yet: queued in the
  // inbox, waiting, running or finishing. Exact at the call, unlike the snapshot's counts.
  int64_t NumLive() const;
  // A KV event subscription (kv_events.h): a snapshot of the prefix cache taken between two
  // steps, then every later change, one batch per step. The engine records events only while
  // someone subscribes. Waits for the engine thread (at most the step in flight);
  // RESOURCE_EXHAUSTED past max_kv_event_subscribers, UNAVAILABLE after shutdown began.
  absl::StatusOr<std::unique_ptr<KvEventLog::Subscription>> SubscribeKvEvents(
      std::function<void()> notify);
  const KvEventLog& kv_events() const { return *kv_events_; }
  // Ends every KV event subscription (UNAVAILABLE) and refuses new ones: for shutdown, so no
  // subscriber holds the server's drain. Any thread; does not wait for the engine thread.
  void CloseKvEvents() { kv_events_->Close(); }
  const model_io::ModelConfig& model_config() const { return config_; }
  const EngineLimits& limits() const { return limits_; }

 private:
  friend class EngineContext;
  Engine(std::unique_ptr<model::ModelRunner> runner, const EngineOptions& options,
         std::unique_ptr<TextDecoder> decoder);

  // Runs `fn` on the engine thread and waits for it.
  absl::Status Call(std::function<absl::Status()> fn);
  void Post(std::function<void()> task);
  void Loop();
  void Step();
  bool CanStep() const;
  // Publishes the post-step ServerInfo (running ids only when they changed), then delivers the
  // finish callbacks of that step, so a client that has its final message never reads an older
  // snapshot (GetServerInfo, gauges).
  void PublishSnapshot();
  ServerInfo BuildInfo() const;
  // Hands this step's KV events to the log; stops recording once nobody subscribes.
  void PublishKvEvents();
  void ApplyPause(PauseMode mode);
  void ApplyContinue();
  absl::Status ApplyFlush();
  absl::Status ApplyReplaceRunner(std::unique_ptr<model::ModelRunner> runner);

  const EngineOptions options_;
  const model_io::ModelConfig config_;
  EngineLimits limits_;
  std::atomic<int64_t> weight_version_;
  std::atomic<bool> published_paused_{false};  // snapshot_.paused, set with it
  std::atomic<int64_t> num_commands_{0};

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<std::function<void()>> inbox_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<std::string> live_ids_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 seed_rng_ ABSL_GUARDED_BY(mu_);
  ServerInfo snapshot_ ABSL_GUARDED_BY(mu_);

  // Engine-thread state.
  std::unique_ptr<model::ModelRunner> runner_;
  std::unique_ptr<TextDecoder> decoder_;
  std::unique_ptr<Scheduler> scheduler_;
  Sampler sampler_;
  model::ForwardOutput forward_out_;
  SampledBatch sampled_;
  bool paused_ = false;
  PauseMode pause_mode_ = PauseMode::kNone;
  int64_t num_steps_ = 0;
  int64_t published_running_epoch_ = 0;  // scheduler running_epoch() of snapshot_'s ids
  std::string invariant_error_;
  std::shared_ptr<KvEventLog> kv_events_;
  std::vector<KvCacheEvent> kv_pending_;  // the radix cache's events since the last publish
  bool kv_recording_ = false;
  std::vector<std::function<void()>> deferred_finishes_;  // delivered by PublishSnapshot

  std::thread thread_;
  std::atomic<std::thread::id> thread_id_;
};

}  // namespace rl::engine
