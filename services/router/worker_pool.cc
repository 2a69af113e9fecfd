#include "services/router/worker_pool.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "common/status.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "spdlog/spdlog.h"

namespace rl::router {
namespace {

// Runs fn(0..n-1) on at most kMaxProbeThreads threads: blocking add checks (start-up) proceed
// concurrently without one thread per worker (the pool size is an admin input).
constexpr size_t kMaxProbeThreads = 32;

void ForEachConcurrently(size_t n, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  threads.reserve(std::min(n, kMaxProbeThreads));
  for (size_t t = 0; t < std::min(n, kMaxProbeThreads); ++t) {
    threads.emplace_back([&] {
      for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

std::string FleetWeights::Describe() const {
  switch (source) {
    case Source::kNone:
      return "";
    case Source::kDisk:
      return absl::StrCat("disk:", path);
    case Source::kTensor:
      return "tensor";
    case Source::kDistributed:
      return "distributed";
  }
  return "";
}

Worker::Worker(std::string address) : address_(std::move(address)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(512 << 20);
  args.SetMaxSendMessageSize(512 << 20);
  channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
  worker_stub_ = rl::v1::Worker::NewStub(channel_);
  admin_stub_ = rl::v1::Admin::NewStub(channel_);
  data_stubs_.push_back(rl::v1::Worker::NewStub(channel_));
  for (int i = 1; i < kDataChannels; ++i) {
    grpc::ChannelArguments data_args = args;
    data_args.SetInt("rl-data-channel", i);  // a connection of its own
    data_stubs_.push_back(rl::v1::Worker::NewStub(
        grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), data_args)));
  }
}

void Worker::CancelCalls(const std::string& reason) {
  absl::MutexLock lock(&calls_mu_);
  dead_ = true;
  dead_reason_ = reason;
  for (CallGuard* g : calls_) {
    g->reason_ = reason;
    g->cancelled_ = true;
    g->ctx_->TryCancel();
  }
}

void Worker::Revive() {
  absl::MutexLock lock(&calls_mu_);
  dead_ = false;
  dead_reason_.clear();
}

CallGuard::CallGuard(Worker* worker, grpc::ClientContext* ctx) : worker_(worker), ctx_(ctx) {
  absl::MutexLock lock(&worker_->calls_mu_);
  if (worker_->dead_) {
    reason_ = worker_->dead_reason_;
    cancelled_ = true;
    ctx_->TryCancel();
  }
  worker_->calls_.insert(this);
}

CallGuard::~CallGuard() {
  absl::MutexLock lock(&worker_->calls_mu_);
  worker_->calls_.erase(this);
}

std::string CallGuard::reason() const {
  absl::MutexLock lock(&worker_->calls_mu_);
  return reason_;
}

Lease::Lease(std::shared_ptr<Worker> w) : worker_(std::move(w)) {
  if (worker_) worker_->in_flight_.fetch_add(1);
}

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    if (worker_) worker_->in_flight_.fetch_sub(1);
    worker_ = std::move(other.worker_);
  }
  return *this;
}

Lease::~Lease() {
  if (worker_) worker_->in_flight_.fetch_sub(1);
}

WorkerPool::WorkerPool(const PoolOptions& options) : options_(options) {
  health_thread_ = std::thread([this] { HealthLoop(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  health_thread_.join();
}

absl::Status WorkerPool::AddAll(const std::vector<std::string>& addresses) {
  std::vector<absl::Status> statuses(addresses.size());
  ForEachConcurrently(addresses.size(), [&](size_t i) { statuses[i] = Add(addresses[i]); });
  for (const absl::Status& s : statuses) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status WorkerPool::Add(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address: '", address, "' is not HOST:PORT"));
  }
  std::shared_ptr<Worker> w;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& existing : workers_) {
      if (existing->address() == address) return absl::OkStatus();
    }
    w = std::make_shared<Worker>(address);
    w->last_error_ = "not checked yet";
    workers_.push_back(w);
    std::sort(workers_.begin(), workers_.end(),
              [](const auto& a, const auto& b) { return a->address() < b->address(); });
  }
  spdlog::info("worker {} added", address);
  // Let a freshly added worker serve at once when it is healthy.
  for (int i = 0; i < options_.success_threshold; ++i) Probe(w);
  return absl::OkStatus();
}

absl::Status WorkerPool::Remove(const std::string& address) {
  std::shared_ptr<Worker> gone;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(workers_.begin(), workers_.end(),
                           [&](const auto& w) { return w->address() == address; });
    if (it == workers_.end()) {
      return absl::NotFoundError(absl::StrCat("address: no worker '", address, "'"));
    }
    gone = *it;
    gone->removed_ = true;
    gone->live_ = false;
    workers_.erase(it);
  }
  spdlog::info("worker {} removed", address);
  return absl::OkStatus();
}

absl::Status WorkerPool::SetEnabled(const std::string& address, bool enabled) {
  absl::MutexLock lock(&mu_);
  for (const auto& w : workers_) {
    if (w->address() == address) {
      w->enabled_ = enabled;
      w->disabled_reason_.clear();
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("address: no worker '", address, "'"));
}

bool WorkerPool::BehindLocked(const Worker& w) const {
  return fleet_.version >= 0 && w.weight_version_ < fleet_.version;
}

bool WorkerPool::RoutableLocked(const Worker& w) const {
  return w.live_ && w.enabled_ && !w.held_ && w.serving_ && !w.suspect_ && !BehindLocked(w);
}

std::vector<rl::v1::WorkerStatus> WorkerPool::List() const {
  absl::MutexLock lock(&mu_);
  const int64_t current = CurrentVersionLocked();
  std::vector<rl::v1::WorkerStatus> out;
  for (const auto& w : workers_) {
    rl::v1::WorkerStatus s;
    s.set_address(w->address());
    std::vector<std::string> why;
    if (!w->live_) {
      s.set_state(rl::v1::WORKER_STATE_DEAD);
      why.push_back(w->last_error_.empty() ? "dead" : w->last_error_);
    } else if (BehindLocked(*w)) {
      const std::string behind = absl::StrCat("weight_version ", w->weight_version_,
                                              " is behind the fleet's ", fleet_.version);
      if (fleet_.replayable()) {
        s.set_state(rl::v1::WORKER_STATE_SYNCING);
        why.push_back(absl::StrCat(behind, "; catching up from ", fleet_.path));
      } else {
        s.set_state(rl::v1::WORKER_STATE_STALE);
        why.push_back(absl::StrCat(behind, ", which came from ",
                                   fleet_.source == FleetWeights::Source::kTensor
                                       ? "a tensor stream"
                                       : "a distributed group",
                                   " the router cannot replay; resync it: rlctl workers resync ",
                                   w->address(), " --from-disk DIR"));
      }
    } else {
      s.set_state(rl::v1::WORKER_STATE_LIVE);
    }
    if (!w->enabled_) {
      why.push_back(w->disabled_reason_.empty() ? "disabled by an operator" : w->disabled_reason_);
    }
    if (w->live_ && w->held_) why.push_back("held out of routing by an admin broadcast");
    if (w->live_ && w->suspect_) why.push_back("a call failed: waiting for a health check");
    if (w->live_ && !w->serving_) {
      why.push_back("health NOT_SERVING (asleep or updating weights)");
    }
    s.set_reason(absl::StrJoin(why, "; "));
    s.set_enabled(w->enabled_);
    s.set_in_flight(w->in_flight());
    s.set_weight_version(w->weight_version_);
    s.set_version_mismatch(w->weight_version_ >= 0 && current >= 0 &&
                           w->weight_version_ != current);
    s.set_consecutive_failures(w->failures_);
    s.set_requests_served(w->served_.load());
    out.push_back(std::move(s));
  }
  return out;
}

void WorkerPool::FillList(rl::v1::WorkerListResponse* out) const {
  for (auto& s : List()) *out->add_workers() = std::move(s);
  const FleetWeights fleet = fleet_weights();
  out->set_fleet_weight_version(fleet.version);
  out->set_fleet_weight_source(fleet.Describe());
}

Lease WorkerPool::Pick(const std::set<std::string>& exclude) {
  absl::MutexLock lock(&mu_);
  const size_t n = workers_.size();
  for (size_t i = 0; i < n; ++i) {
    const std::shared_ptr<Worker>& w = workers_[(next_ + i) % n];
    if (RoutableLocked(*w) && !exclude.contains(w->address())) {
      if (w->channel()->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
        // The connection dropped since the last check: verify process and version first.
        w->suspect_ = true;
        probe_now_ = true;
        continue;
      }
      next_ = (next_ + i + 1) % n;
      w->served_.fetch_add(1);
      return Lease(w);
    }
  }
  return Lease();
}

void WorkerPool::SetServing(const std::string& address, bool serving) {
  absl::MutexLock lock(&mu_);
  for (const auto& w : workers_) {
    if (w->address() == address) w->serving_ = serving;
  }
}

void WorkerPool::SetHeld(Worker* w, bool held) {
  absl::MutexLock lock(&mu_);
  w->held_ = held;
}

void WorkerPool::DisablePartial(Worker* w, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  w->enabled_ = false;
  w->disabled_reason_ = absl::StrCat("weights may be partial: ", reason,
                                     " (resync it, or rlctl workers enable ", w->address(), ")");
  spdlog::warn("worker {} left out of routing: {}", w->address(), w->disabled_reason_);
}

void WorkerPool::ClearPartial(Worker* w) {
  absl::MutexLock lock(&mu_);
  if (!w->enabled_ && !w->disabled_reason_.empty()) {
    w->enabled_ = true;
    w->disabled_reason_.clear();
  }
}

std::vector<std::shared_ptr<Worker>> WorkerPool::LiveWorkers() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Worker>> out;
  for (const auto& w : workers_) {
    if (w->live_) out.push_back(w);
  }
  return out;
}

std::shared_ptr<Worker> WorkerPool::Find(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  for (const auto& w : workers_) {
    if (w->address() == address) return w;
  }
  return nullptr;
}

bool WorkerPool::IsEnabled(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  for (const auto& w : workers_) {
    if (w->address() == address) return w->enabled_;
  }
  return false;
}

bool WorkerPool::KillLocked(Worker* w, const std::string& reason) {
  w->last_error_ = reason;
  w->successes_ = 0;
  const bool was_live = w->live_;
  w->live_ = false;
  // Streams and admin calls waiting on it end now (retried elsewhere where possible).
  w->CancelCalls(reason);
  return was_live;
}

void WorkerPool::ReportFailure(Worker* w) {
  absl::MutexLock lock(&mu_);
  w->successes_ = 0;
  w->suspect_ = true;
  probe_now_ = true;
  if (++w->failures_ >= options_.failure_threshold && w->live_) {
    KillLocked(w, absl::StrCat("marked dead after ", w->failures_, " failed calls"));
    spdlog::warn("worker {} marked dead after {} failures", w->address(), w->failures_);
  }
}

void WorkerPool::MarkDead(Worker* w, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  w->failures_ = std::max(w->failures_, options_.failure_threshold);
  if (KillLocked(w, reason)) spdlog::warn("worker {} marked dead: {}", w->address(), reason);
}

void WorkerPool::ReportVersion(Worker* w, int64_t version) {
  std::shared_ptr<Worker> shared;
  {
    absl::MutexLock lock(&mu_);
    w->weight_version_ = version;
    if (!BehindLocked(*w) || !fleet_.replayable()) return;
    for (const auto& candidate : workers_) {
      if (candidate.get() == w) shared = candidate;
    }
  }
  if (shared) MaybeCatchUp(shared);
}

int64_t WorkerPool::CurrentVersionLocked() const {
  int64_t v = -1;
  for (const auto& w : workers_) {
    if (w->live_) v = std::max(v, w->weight_version_);
  }
  return v;
}

int64_t WorkerPool::CurrentVersion() const {
  absl::MutexLock lock(&mu_);
  return CurrentVersionLocked();
}

bool WorkerPool::VersionMismatch() const {
  absl::MutexLock lock(&mu_);
  int64_t lo = INT64_MAX, hi = -1;
  for (const auto& w : workers_) {
    if (!w->live_) continue;
    lo = std::min(lo, w->weight_version_);
    hi = std::max(hi, w->weight_version_);
  }
  return hi >= 0 && lo != hi;
}

void WorkerPool::SetFleetWeights(const FleetWeights& fleet) {
  std::vector<std::shared_ptr<Worker>> all;
  {
    absl::MutexLock lock(&mu_);
    fleet_ = fleet;
    all = workers_;
  }
  spdlog::info("fleet weights: version {} from {}", fleet.version, fleet.Describe());
  for (const auto& w : all) MaybeCatchUp(w);
}

FleetWeights WorkerPool::fleet_weights() const {
  absl::MutexLock lock(&mu_);
  return fleet_;
}

int64_t WorkerPool::fleet_version() const {
  absl::MutexLock lock(&mu_);
  return fleet_.version;
}

bool WorkerPool::Behind(Worker* w) const {
  absl::MutexLock lock(&mu_);
  return BehindLocked(*w);
}

void WorkerPool::SetCatchUpHandler(CatchUpHandler handler) {
  absl::MutexLock lock(&handler_mu_);
  catch_up_ = std::move(handler);
}

void WorkerPool::FinishSync(Worker* w) {
  absl::MutexLock lock(&mu_);
  w->syncing_ = false;
}

void WorkerPool::MaybeCatchUp(const std::shared_ptr<Worker>& w) {
  {
    absl::MutexLock lock(&mu_);
    const bool behind = fleet_.replayable() && BehindLocked(*w);
    if (!w->live_ || w->removed_ || w->syncing_ || !(behind || w->rejoined_)) return;
    w->syncing_ = true;
    w->rejoined_ = false;
  }
  bool handled = false;
  {
    absl::MutexLock lock(&handler_mu_);
    if (catch_up_) {
      catch_up_(w);
      handled = true;
    }
  }
  if (!handled) FinishSync(w.get());
}

void WorkerPool::Probe(const std::shared_ptr<Worker>& w) {
  absl::Notification done;
  ProbeAsync(w, [&done] { done.Notify(); });
  done.WaitForNotification();
}

namespace {

// One health check in flight: gRPC health, then GetLoad for the version, both asynchronous.
struct ProbeCall {
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub;
  grpc::ClientContext hctx;
  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckResponse health;
  grpc::ClientContext lctx;
  rl::v1::GetLoadRequest lreq;
  rl::v1::GetLoadResponse load;
};

}  // namespace

void WorkerPool::ProbeAsync(const std::shared_ptr<Worker>& w, std::function<void()> done) {
  const auto deadline = std::chrono::system_clock::now() + options_.health_timeout;
  auto call = std::make_shared<ProbeCall>();
  call->health_stub = grpc::health::v1::Health::NewStub(w->channel());
  call->hctx.set_deadline(deadline);
  call->lctx.set_deadline(deadline);
  auto finish = [this, w, call, done = std::move(done)](grpc::Status s, bool version_known) {
    ApplyCheck(w, s, call->health, call->load, version_known);
    done();
  };
  call->health_stub->async()->Check(
      &call->hctx, &call->hreq, &call->health,
      [w, call, finish = std::move(finish)](grpc::Status s) mutable {
        // NOT_SERVING (asleep, or a weight update in progress) is not a failure of the process:
        // the worker keeps its state; only unreachable workers die.
        if (!s.ok()) {
          finish(std::move(s), true);
          return;
        }
        w->worker_stub().async()->GetLoad(
            &call->lctx, &call->lreq, &call->load,
            [finish = std::move(finish)](grpc::Status s) mutable {
              // A data-plane key may guard GetLoad; the process is reachable all the same.
              if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                  s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
                finish(grpc::Status::OK, false);
                return;
              }
              finish(std::move(s), true);
            });
      });
}

void WorkerPool::ApplyCheck(const std::shared_ptr<Worker>& w, const grpc::Status& s,
                            const grpc::health::v1::HealthCheckResponse& health,
                            const rl::v1::GetLoadResponse& load, bool version_known) {
  {
    absl::MutexLock lock(&mu_);
    if (w->removed_) return;
    if (!s.ok()) {
      w->successes_ = 0;
      w->last_error_ = absl::StrCat("health check: ", s.error_message());
      if (++w->failures_ >= options_.failure_threshold && w->live_) {
        KillLocked(w.get(), w->last_error_);
        spdlog::warn("worker {} dead: {}", w->address(), s.error_message());
      }
      return;
    }
    w->failures_ = 0;
    w->suspect_ = false;
    if (version_known) w->weight_version_ = load.weight_version();
    w->serving_ = health.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    if (!w->live_) {
      ++w->successes_;
      const int64_t current = CurrentVersionLocked();
      // With a recorded fleet version a worker at an older one is readmitted as behind (caught
      // up or listed stale, never routed); without one only the newest live version serves.
      if (w->successes_ >= options_.success_threshold &&
          (fleet_.version >= 0 || current < 0 || w->weight_version_ >= current)) {
        w->live_ = true;
        w->successes_ = 0;
        w->last_error_.clear();
        w->rejoined_ = true;
        w->Revive();
        spdlog::info("worker {} live (weight_version {})", w->address(), w->weight_version_);
      }
    }
  }
  MaybeCatchUp(w);
}

void WorkerPool::CheckAll() {
  std::vector<std::shared_ptr<Worker>> all;
  {
    absl::MutexLock lock(&mu_);
    all = workers_;
  }
  // All at once, asynchronously: a round costs one health timeout at most, on no thread of its
  // own.
  absl::BlockingCounter pending(static_cast<int>(all.size()));
  for (const auto& w : all) ProbeAsync(w, [&pending] { pending.DecrementCount(); });
  pending.Wait();
}

void WorkerPool::HealthLoop() {
  absl::MutexLock lock(&mu_);
  auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || probe_now_; };
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&wake), absl::FromChrono(options_.health_interval));
    if (stop_) break;
    probe_now_ = false;
    mu_.Unlock();
    CheckAll();
    mu_.Lock();
  }
}

}  // namespace rl::router
