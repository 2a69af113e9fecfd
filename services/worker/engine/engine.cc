#include "services/worker/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status.h"

namespace rl::engine {
namespace {

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* PauseModeName(PauseMode mode) {
  switch (mode) {
    case PauseMode::kNone:
      return "none";
    case PauseMode::kDrain:
      return "drain";
    case PauseMode::kInPlace:
      return "in_place";
    case PauseMode::kRetract:
      return "retract";
    case PauseMode::kAbort:
      return "abort";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// EngineContext

model::ModelRunner& EngineContext::runner() { return *engine_->runner_; }

absl::Status EngineContext::ReplaceRunner(std::unique_ptr<model::ModelRunner> runner) {
  return engine_->ApplyReplaceRunner(std::move(runner));
}

void EngineContext::Pause(PauseMode mode) { engine_->ApplyPause(mode); }

void EngineContext::Continue() { engine_->ApplyContinue(); }

absl::Status EngineContext::FlushCache() { return engine_->ApplyFlush(); }

int32_t EngineContext::KeepKvThroughUpdate() { return engine_->scheduler_->KeepKvThroughUpdate(); }

int32_t EngineContext::AbortAll(const std::string& message) {
  return engine_->scheduler_->AbortAll(message, NowUs());
}

bool EngineContext::paused() const { return engine_->paused_; }
PauseMode EngineContext::pause_mode() const { return engine_->pause_mode_; }
bool EngineContext::has_running() const { return engine_->scheduler_->HasRunning(); }
bool EngineContext::has_waiting() const { return engine_->scheduler_->HasWaiting(); }
absl::Status EngineContext::CheckInvariants() const {
  return engine_->scheduler_->CheckInvariants();
}
int64_t EngineContext::weight_version() const { return engine_->weight_version(); }

void EngineContext::set_weight_version(int64_t version) {
  engine_->weight_version_.store(version);
  engine_->scheduler_->set_weight_version(version);
}

ServerInfo EngineContext::info() const {
  ServerInfo info = engine_->BuildInfo();
  info.running_ids = engine_->scheduler_->RunningIds();
  return info;
}

// ---------------------------------------------------------------------------------------------
// Engine

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<model::ModelRunner> runner,
                                                       const EngineOptions& options,
                                                       std::unique_ptr<TextDecoder> decoder) {
  if (runner == nullptr) return absl::InvalidArgumentError("runner: must not be null");
  const model_io::ModelConfig& c = runner->config();
  if (c.vocab_size <= 0) return absl::InvalidArgumentError("runner: vocab_size must be > 0");
  if (runner->page_size() <= 0) return absl::InvalidArgumentError("runner: page_size must be > 0");
  if (runner->num_kv_slots() < runner->page_size()) {
    return absl::InvalidArgumentError(absl::StrCat("runner: ", runner->num_kv_slots(),
                                                   " KV slots hold no whole page of ",
                                                   runner->page_size()));
  }
  const SchedulerOptions& so = options.scheduler;
  if (so.max_running_requests <= 0) {
    return absl::InvalidArgumentError("max_running_requests: must be > 0");
  }
  if (so.chunked_prefill_size <= 0) {
    return absl::InvalidArgumentError("chunked_prefill_size: must be > 0");
  }
  if (options.max_queued_requests <= 0) {
    return absl::InvalidArgumentError("max_queued_requests: must be > 0");
  }
  if (!(so.min_new_token_ratio >= 0 && so.min_new_token_ratio <= so.init_new_token_ratio &&
        so.init_new_token_ratio <= 1)) {
    return absl::InvalidArgumentError(
        "new_token_ratio: need 0 <= min_new_token_ratio <= init_new_token_ratio <= 1");
  }
  return std::unique_ptr<Engine>(new Engine(std::move(runner), options, std::move(decoder)));
}

Engine::Engine(std::unique_ptr<model::ModelRunner> runner, const EngineOptions& options,
               std::unique_ptr<TextDecoder> decoder)
    : options_(options),
      config_(runner->config()),
      weight_version_(options.initial_weight_version),
      seed_rng_(std::random_device{}()),
      runner_(std::move(runner)),
      decoder_(std::move(decoder)) {
  const int64_t kv_tokens = runner_->num_kv_slots() / runner_->page_size() * runner_->page_size();
  limits_.vocab_size = config_.vocab_size;
  limits_.max_context_len =
      config_.max_position_embeddings > 0 ? config_.max_position_embeddings : kv_tokens;
  limits_.max_kv_tokens = kv_tokens;
  limits_.has_text_decoder = decoder_ != nullptr;
  limits_.routing_export = options.enable_return_routed_experts && config_.IsMoe();

  SchedulerOptions so = options.scheduler;
  so.num_kv_slots = runner_->num_kv_slots();
  so.page_size = runner_->page_size();
  so.max_context_len = limits_.max_context_len;
  so.eos_token_ids = config_.eos_token_ids;
  so.routing_layers = so.routing_top_k = so.routing_width = 0;
  if (limits_.routing_export) {
    so.routing_layers = static_cast<int64_t>(config_.MoeLayers().size());
    so.routing_top_k = config_.num_experts_per_tok;
    so.routing_width = so.routing_layers * so.routing_top_k;
  }
  scheduler_ = std::make_unique<Scheduler>(so, decoder_.get());
  kv_events_ =
      KvEventLog::Create(static_cast<size_t>(std::max<int64_t>(options.kv_event_buffer_units, 1)),
                         static_cast<size_t>(std::max(options.max_kv_event_subscribers, 1)));
  sampler_ = Sampler(SamplerOptions{config_.vocab_size, config_.eos_token_ids});
  scheduler_->set_weight_version(options.initial_weight_version);
  {
    absl::MutexLock lock(&mu_);
    snapshot_ = BuildInfo();
    published_paused_.store(snapshot_.paused, std::memory_order_release);
    published_running_epoch_ = scheduler_->running_epoch();
  }
  thread_ = std::thread([this] { Loop(); });
  thread_id_.store(thread_.get_id());
}

Engine::~Engine() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.Signal();
  }
  thread_.join();
}

void Engine::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  inbox_.push_back(std::move(task));
  cv_.Signal();
}

absl::Status Engine::Call(std::function<absl::Status()> fn) {
  if (std::this_thread::get_id() == thread_id_.load()) {
    return absl::FailedPreconditionError(
        "blocking engine call made from the engine thread (e.g. inside a request callback)");
  }
  absl::Notification done;
  absl::Status result;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("engine is shutting down");
    inbox_.push_back([&] {
      num_commands_.fetch_add(1);
      result = fn();
      PublishSnapshot();
      done.Notify();
    });
    cv_.Signal();
  }
  done.WaitForNotification();
  return result;
}

absl::Status Engine::Submit(GenerateRequest request, RequestCallbacks callbacks) {
  if (!callbacks.on_finish) return absl::InvalidArgumentError("callbacks.on_finish: required");
  RETURN_IF_ERROR(ValidateRequest(request, limits_));
  auto group = std::make_shared<RequestGroup>();
  group->submit_us = NowUs();
  group->callbacks.on_output = std::move(callbacks.on_output);
  // The user's callback outlives the group: it runs after the step, from PublishSnapshot.
  auto user = std::make_shared<std::function<void(GenerateResult)>>(std::move(callbacks.on_finish));
  group->callbacks.on_finish = [this, id = request.id, remaining = request.sampling.n,
                                user](GenerateResult result) mutable {
    const bool last = --remaining == 0;
    auto deliver = [this, id, last, user, result = std::move(result)]() mutable {
      if (last) {
        absl::MutexLock lock(&mu_);
        live_ids_.erase(id);
      }
      (*user)(std::move(result));
    };
    if (std::this_thread::get_id() == thread_id_.load()) {
      deferred_finishes_.push_back(std::move(deliver));
    } else {
      deliver();
    }
  };
  const std::string id = request.id;
  group->request = std::move(request);

  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("engine is shutting down");
  if (live_ids_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("id: request '", id, "' is already in flight"));
  }
  if (static_cast<int64_t>(live_ids_.size()) >= options_.max_queued_requests) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request queue is full (", options_.max_queued_requests, " requests)"));
  }
  live_ids_.insert(id);
  const uint64_t seed = seed_rng_();
  inbox_.push_back([this, group = std::move(group), seed]() mutable {
    scheduler_->Add(std::move(group), seed);
  });
  cv_.Signal();
  return absl::OkStatus();
}

int64_t Engine::NumLive() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(live_ids_.size());
}

absl::StatusOr<int32_t> Engine::Abort(const std::string& id, const std::string& message) {
  int32_t count = 0;
  RETURN_IF_ERROR(Call([&] {
    count = scheduler_->Abort(id, message, NowUs());
    return absl::OkStatus();
  }));
  return count;
}

void Engine::AbortAsync(const std::string& id, const std::string& message) {
  Post([this, id, message] { scheduler_->Abort(id, message, NowUs()); });
}

absl::StatusOr<int32_t> Engine::AbortAll(const std::string& message) {
  int32_t count = 0;
  RETURN_IF_ERROR(Call([&] {
    count = scheduler_->AbortAll(message, NowUs());
    return absl::OkStatus();
  }));
  return count;
}

absl::Status Engine::Pause(PauseMode mode) {
  if (mode == PauseMode::kNone) return absl::InvalidArgumentError("mode: must be named");
  return Call([&] {
    ApplyPause(mode);
    return absl::OkStatus();
  });
}

absl::Status Engine::Continue() {
  return Call([&] {
    ApplyContinue();
    return absl::OkStatus();
  });
}

absl::StatusOr<DrainResult> Engine::Drain(absl::Duration timeout) {
  bool drains = false;
  RETURN_IF_ERROR(Call([&] {
    ApplyPause(PauseMode::kDrain);
    drains = pause_mode_ == PauseMode::kDrain;
    return absl::OkStatus();
  }));
  // The snapshot is published under mu_ after every step and command, so the condition is
  // re-checked whenever it may have changed; no polling.
  auto settled = [this, drains]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const SchedulerStats& st = snapshot_.scheduler;
    return !drains || stopping_ || (st.num_running == 0 && st.num_waiting == 0) ||
           !snapshot_.paused || snapshot_.pause_mode != PauseMode::kDrain;
  };
  DrainResult out;
  mu_.LockWhenWithDeadline(absl::Condition(&settled), absl::Now() + timeout);
  const ServerInfo& info = snapshot_;
  out.num_still_active = info.scheduler.num_running + info.scheduler.num_waiting;
  out.drained = out.num_still_active == 0;
  out.num_held = info.scheduler.num_held;
  for (size_t i = 0; i < info.running_ids.size() && i < DrainResult::kMaxDrainIds; ++i) {
    out.still_active_ids.push_back(info.running_ids[i]);
  }
  mu_.Unlock();
  return out;
}

absl::Status Engine::FlushCache() {
  return Call([&] { return ApplyFlush(); });
}

absl::Status Engine::RunOnEngineThread(std::function<absl::Status(EngineContext&)> fn) {
  return Call([&] {
    EngineContext ctx(this);
    return fn(ctx);
  });
}

absl::Status Engine::SetWeightVersion(int64_t version) {
  return Call([&] {
    weight_version_.store(version);
    scheduler_->set_weight_version(version);
    return absl::OkStatus();
  });
}

ServerInfo Engine::GetServerInfo() const {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

void Engine::ApplyPause(PauseMode mode) {
  if (mode == PauseMode::kNone) return;
  if (mode == PauseMode::kAbort) {
    scheduler_->AbortAll("aborted by pause_generation(abort)", NowUs());
  } else if (mode == PauseMode::kRetract) {
    scheduler_->RetractAll();
  }
  pause_mode_ = paused_ ? std::max(pause_mode_, mode) : mode;
  paused_ = true;
  // Arrivals wait for the continue in every pause; a drain keeps them apart from what it
  // finishes (a stronger pause keeps the held ones held).
  if (mode == PauseMode::kDrain) scheduler_->Hold(true);
}

void Engine::ApplyContinue() {
  paused_ = false;
  pause_mode_ = PauseMode::kNone;
  scheduler_->Hold(false);
}

absl::Status Engine::ApplyFlush() {
  if (scheduler_->HasRunning()) {
    return absl::FailedPreconditionError("cannot flush the cache while requests are running");
  }
  const bool retracted = paused_ && pause_mode_ >= PauseMode::kRetract;
  if (scheduler_->HasWork() && !retracted) {
    return absl::FailedPreconditionError(
        "cannot flush the cache while requests are waiting (pause with retract first)");
  }
  return scheduler_->Flush();
}

absl::Status Engine::ApplyReplaceRunner(std::unique_ptr<model::ModelRunner> runner) {
  if (runner == nullptr) return absl::InvalidArgumentError("runner: must not be null");
  if (runner->config().vocab_size != config_.vocab_size ||
      runner->num_kv_slots() != runner_->num_kv_slots() ||
      runner->page_size() != runner_->page_size()) {
    return absl::InvalidArgumentError(
        "runner: the new runner must have the same vocabulary, KV slots and page size");
  }
  // The scheduler sized routed-experts export (layers x top-k) from the first runner.
  const model_io::ModelConfig& next = runner->config();
  if (next.IsMoe() != config_.IsMoe() || next.MoeLayers() != config_.MoeLayers() ||
      next.num_experts_per_tok != config_.num_experts_per_tok) {
    return absl::InvalidArgumentError(
        "runner: the new runner must have the same MoE layers and experts per token");
  }
  if (scheduler_->HasRunning()) {
    return absl::FailedPreconditionError("cannot replace the runner while requests are running");
  }
  runner_ = std::move(runner);
  return scheduler_->Flush();
}

bool Engine::CanStep() const {
  return (!paused_ || pause_mode_ == PauseMode::kDrain) && scheduler_->HasWork();
}

void Engine::Loop() {
  while (true) {
    std::deque<std::function<void()>> tasks;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      while (inbox_.empty() && !stopping_ && !CanStep()) cv_.Wait(&mu_);
      tasks.swap(inbox_);
      stopping = stopping_;
    }
    for (auto& task : tasks) task();
    if (stopping) {
      scheduler_->AbortAll("engine is shutting down", NowUs());
      PublishSnapshot();
      return;
    }
    if (CanStep()) Step();
    PublishSnapshot();
  }
}

void Engine::PublishKvEvents() {
  if (!kv_recording_) return;
  if (!kv_pending_.empty()) {
    kv_events_->Append(std::move(kv_pending_),
                       absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
    kv_pending_.clear();
  }
  if (!kv_events_->active()) {
    scheduler_->kv().set_event_sink(nullptr);
    kv_recording_ = false;
  }
}

absl::StatusOr<std::unique_ptr<KvEventLog::Subscription>> Engine::SubscribeKvEvents(
    std::function<void()> notify) {
  std::unique_ptr<KvEventLog::Subscription> subscription;
  RETURN_IF_ERROR(Call([&]() -> absl::Status {
    PublishKvEvents();  // what happened before belongs to the earlier subscribers only
    std::vector<KvCacheEvent> snapshot;
    scheduler_->kv().Snapshot(&snapshot);
    ASSIGN_OR_RETURN(subscription, kv_events_->Subscribe(std::move(snapshot), std::move(notify)));
    if (!kv_recording_) {
      scheduler_->kv().set_event_sink(&kv_pending_);
      kv_recording_ = true;
    }
    return absl::OkStatus();
  }));
  return subscription;
}

void Engine::Step() {
  ScheduledBatch batch = scheduler_->Schedule(NowUs());
  if (batch.empty()) return;
  absl::Status status = runner_->Forward(batch.input, &forward_out_);
  if (status.ok()) status = sampler_.Sample(batch, &forward_out_, &sampled_);
  if (status.ok()) {
    scheduler_->Update(batch, &sampled_, NowUs());
  } else {
    scheduler_->FailBatch(batch, status, NowUs());
  }
  ++num_steps_;
  if (options_.check_invariants && invariant_error_.empty()) {
    absl::Status check = scheduler_->CheckInvariants();
    if (!check.ok()) invariant_error_ = std::string(check.message());
  }
}

ServerInfo Engine::BuildInfo() const {
  ServerInfo info;
  info.paused = paused_;
  info.pause_mode = pause_mode_;
  info.backend = runner_->backend_name();
  info.scheduler = scheduler_->Stats();
  info.num_steps = num_steps_;
  info.weight_version = weight_version_.load();
  info.invariant_error = invariant_error_;
  return info;
}

void Engine::PublishSnapshot() {
  // KV events first: whoever reads a finish (below) finds the events of its step published.
  PublishKvEvents();
  // The counters are copied every step; the running ids (one string per running sequence)
  // only when the running batch changed since the last snapshot.
  ServerInfo info = BuildInfo();
  const int64_t epoch = scheduler_->running_epoch();
  const bool ids_changed = epoch != published_running_epoch_;
  if (ids_changed) {
    info.running_ids = scheduler_->RunningIds();
    published_running_epoch_ = epoch;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!ids_changed) info.running_ids.swap(snapshot_.running_ids);
    snapshot_ = std::move(info);
    published_paused_.store(snapshot_.paused, std::memory_order_release);
  }
  while (!deferred_finishes_.empty()) {
    std::vector<std::function<void()>> ready;
    ready.swap(deferred_finishes_);
    for (auto& deliver : ready) deliver();
  }
}

}  // namespace rl::engine
