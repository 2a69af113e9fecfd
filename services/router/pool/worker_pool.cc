#include "services/router/pool/worker_pool.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>

#include "absl/container/inlined_vector.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
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

absl::Status NoWorker(const std::string& address) {
  return absl::NotFoundError(absl::StrCat("address: no worker '", address, "'"));
}

}  // namespace

WorkerPool::WorkerPool(const PoolOptions& options, std::unique_ptr<RoutingPolicy> policy)
    : options_(options),
      thresholds_{options.failure_threshold, options.success_threshold},
      policy_(policy != nullptr ? std::move(policy) : MakeRoundRobinPolicy()) {
  health_ = std::make_unique<HealthChecker>(
      HealthCheckOptions{options.health_interval, options.health_timeout},
      [this] { return Snapshot(); },
      [this](const std::shared_ptr<Worker>& w, const HealthReport& r) { ApplyCheck(w, r); });
}

WorkerPool::~WorkerPool() { health_.reset(); }

WorkerPool::Entry* WorkerPool::FindLocked(const Worker* w) {
  for (Entry& e : entries_) {
    if (e.worker.get() == w) return &e;
  }
  return nullptr;  // removed
}

WorkerPool::Entry* WorkerPool::FindLocked(const std::string& address) {
  for (Entry& e : entries_) {
    if (e.worker->address() == address) return &e;
  }
  return nullptr;
}

const WorkerPool::Entry* WorkerPool::FindLocked(const std::string& address) const {
  for (const Entry& e : entries_) {
    if (e.worker->address() == address) return &e;
  }
  return nullptr;
}

std::vector<std::shared_ptr<Worker>> WorkerPool::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Worker>> all;
  all.reserve(entries_.size());
  for (const Entry& e : entries_) all.push_back(e.worker);
  return all;
}

// ---- registry ----

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
    if (FindLocked(address) != nullptr) return absl::OkStatus();
    w = std::make_shared<Worker>(address);
    auto at = std::lower_bound(
        entries_.begin(), entries_.end(), address,
        [](const Entry& e, const std::string& a) { return e.worker->address() < a; });
    entries_.insert(at, Entry{w, WorkerState()});
  }
  spdlog::info("worker {} added", address);
  // Let a freshly added worker serve at once when it is healthy.
  for (int i = 0; i < options_.success_threshold; ++i) Probe(w);
  return absl::OkStatus();
}

absl::Status WorkerPool::Remove(const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(entries_.begin(), entries_.end(),
                           [&](const Entry& e) { return e.worker->address() == address; });
    if (it == entries_.end()) return NoWorker(address);
    entries_.erase(it);  // its handle lives on in leases and calls, with no state here
  }
  spdlog::info("worker {} removed", address);
  return absl::OkStatus();
}

absl::Status WorkerPool::SetEnabled(const std::string& address, bool enabled) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(address);
  if (e == nullptr) return NoWorker(address);
  e->state.SetEnabled(enabled);
  return absl::OkStatus();
}

rl::v1::WorkerStatus WorkerPool::StatusLocked(const Entry& e, int64_t newest_live) const {
  const WorkerState& st = e.state;
  rl::v1::WorkerStatus s;
  s.set_address(e.worker->address());
  std::vector<std::string> why;
  if (!st.live()) {
    s.set_state(rl::v1::WORKER_STATE_DEAD);
    why.push_back(st.last_error().empty() ? "dead" : st.last_error());
  } else if (st.Behind(fleet_.version)) {
    const std::string behind = absl::StrCat("weight_version ", st.weight_version(),
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
                                 e.worker->address(), " --from-disk DIR"));
    }
  } else {
    s.set_state(rl::v1::WORKER_STATE_LIVE);
  }
  if (!st.enabled()) {
    why.push_back(st.disabled_reason().empty() ? "disabled by an operator" : st.disabled_reason());
  }
  if (st.live() && st.holds() > 0) why.push_back("held out of routing by an admin broadcast");
  if (st.liveness() == Liveness::kSuspect) {
    why.push_back("a call failed: waiting for a health check");
  }
  if (st.live() && !st.serving()) why.push_back("health NOT_SERVING (asleep or updating weights)");
  s.set_reason(absl::StrJoin(why, "; "));
  s.set_enabled(st.enabled());
  s.set_in_flight(e.worker->in_flight());
  s.set_weight_version(st.weight_version());
  s.set_version_mismatch(st.weight_version() >= 0 && newest_live >= 0 &&
                         st.weight_version() != newest_live);
  s.set_consecutive_failures(st.failures());
  s.set_requests_served(e.worker->served());
  return s;
}

std::vector<rl::v1::WorkerStatus> WorkerPool::List() const {
  absl::MutexLock lock(&mu_);
  const int64_t newest_live = NewestLiveVersionLocked();
  std::vector<rl::v1::WorkerStatus> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_) out.push_back(StatusLocked(e, newest_live));
  return out;
}

void WorkerPool::FillList(rl::v1::WorkerListResponse* out) const {
  for (auto& s : List()) *out->add_workers() = std::move(s);
  const FleetWeights fleet = fleet_weights();
  out->set_fleet_weight_version(fleet.version);
  out->set_fleet_weight_source(fleet.Describe());
}

std::vector<std::shared_ptr<Worker>> WorkerPool::LiveWorkers() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Worker>> out;
  for (const Entry& e : entries_) {
    if (e.state.live()) out.push_back(e.worker);
  }
  return out;
}

std::shared_ptr<Worker> WorkerPool::Find(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  const Entry* e = FindLocked(address);
  return e != nullptr ? e->worker : nullptr;
}

bool WorkerPool::IsEnabled(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  const Entry* e = FindLocked(address);
  return e != nullptr && e->state.enabled();
}

std::optional<WorkerState> WorkerPool::StateOf(const std::string& address) const {
  absl::MutexLock lock(&mu_);
  const Entry* e = FindLocked(address);
  if (e == nullptr) return std::nullopt;
  return e->state;
}

// ---- picking ----

bool WorkerPool::EligibleLocked(const Entry& e, const PickRequest& request) const {
  return e.state.Routable(fleet_.version) &&
         (request.exclude == nullptr || !request.exclude->contains(e.worker->address()));
}

Lease WorkerPool::Pick(const PickRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::InlinedVector<Candidate, 16> candidates;
  absl::InlinedVector<Entry*, 16> entries;
  for (Entry& e : entries_) {
    if (!EligibleLocked(e, request)) continue;
    candidates.push_back(
        {e.worker.get(), &e.worker->address(), e.worker->in_flight(), e.state.weight_version()});
    entries.push_back(&e);
  }
  while (!candidates.empty()) {
    const size_t i = std::min(policy_->Choose(request, candidates), candidates.size() - 1);
    Entry* e = entries[i];
    if (e->worker->channel()->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
      e->worker->CountServed();
      return Lease(e->worker);
    }
    // The connection dropped since the last check: verify process and version first.
    e->state.OnConnectionLost();
    health_->Wake();
    candidates.erase(candidates.begin() + static_cast<std::ptrdiff_t>(i));
    entries.erase(entries.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return Lease();
}

void WorkerPool::Hold(Worker* w) {
  absl::MutexLock lock(&mu_);
  if (Entry* e = FindLocked(w)) e->state.Hold();
}

void WorkerPool::Release(Worker* w) {
  absl::MutexLock lock(&mu_);
  if (Entry* e = FindLocked(w)) e->state.Release();
}

void WorkerPool::DisablePartial(Worker* w, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(w);
  if (e == nullptr) return;
  e->state.DisablePartial(absl::StrCat("weights may be partial: ", reason,
                                       " (resync it, or rlctl workers enable ", w->address(), ")"));
  spdlog::warn("worker {} left out of routing: {}", w->address(), e->state.disabled_reason());
}

void WorkerPool::ClearPartial(Worker* w) {
  absl::MutexLock lock(&mu_);
  if (Entry* e = FindLocked(w)) e->state.ClearPartial();
}

// ---- health ----

void WorkerPool::OnChange(Entry* e, WorkerState::Change change) {
  switch (change) {
    case WorkerState::Change::kNone:
      break;
    case WorkerState::Change::kDied:
      // Streams and admin calls waiting on it end now (retried elsewhere where possible).
      e->worker->calls().CancelAll(e->state.last_error());
      break;
    case WorkerState::Change::kRevived:
      e->worker->calls().Reopen();
      spdlog::info("worker {} live (weight_version {})", e->worker->address(),
                   e->state.weight_version());
      break;
  }
}

void WorkerPool::ReportFailure(Worker* w) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(w);
  if (e == nullptr) return;
  health_->Wake();
  const WorkerState::Change change = e->state.OnCallFailed(thresholds_);
  if (change == WorkerState::Change::kDied) {
    spdlog::warn("worker {} marked dead after {} failures", w->address(), e->state.failures());
  }
  OnChange(e, change);
}

void WorkerPool::MarkDead(Worker* w, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(w);
  if (e == nullptr) {
    // Removed from the pool while calls to it still run: a hang still ends them.
    w->calls().CancelAll(reason);
    return;
  }
  const bool was_live = e->state.live();
  OnChange(e, e->state.MarkDead(reason, thresholds_));
  if (was_live) spdlog::warn("worker {} marked dead: {}", w->address(), reason);
}

void WorkerPool::ReportVersion(Worker* w, int64_t version) {
  std::shared_ptr<Worker> shared;
  {
    absl::MutexLock lock(&mu_);
    Entry* e = FindLocked(w);
    if (e == nullptr) return;
    e->state.ReportVersion(version);
    if (!e->state.Behind(fleet_.version) || !fleet_.replayable()) return;
    shared = e->worker;
  }
  MaybeCatchUp(shared);
}

void WorkerPool::ApplyCheck(const std::shared_ptr<Worker>& w, const HealthReport& report) {
  {
    absl::MutexLock lock(&mu_);
    Entry* e = FindLocked(w.get());
    if (e == nullptr) return;  // removed while the check ran
    const WorkerState::Change change =
        e->state.OnHealthCheck(report, thresholds_, fleet_.version, NewestLiveVersionLocked());
    if (change == WorkerState::Change::kDied) {
      spdlog::warn("worker {} dead: {}", w->address(), report.error);
    }
    OnChange(e, change);
  }
  MaybeCatchUp(w);
}

int64_t WorkerPool::NewestLiveVersionLocked() const {
  int64_t v = -1;
  for (const Entry& e : entries_) {
    if (e.state.live()) v = std::max(v, e.state.weight_version());
  }
  return v;
}

bool WorkerPool::VersionMismatch() const {
  absl::MutexLock lock(&mu_);
  int64_t lo = INT64_MAX, hi = -1;
  for (const Entry& e : entries_) {
    if (!e.state.live()) continue;
    lo = std::min(lo, e.state.weight_version());
    hi = std::max(hi, e.state.weight_version());
  }
  return hi >= 0 && lo != hi;
}

// ---- fleet weights and the catch-up hand-off ----

void WorkerPool::SetFleetWeights(const FleetWeights& fleet) {
  std::vector<std::shared_ptr<Worker>> all;
  {
    absl::MutexLock handoff(&handoff_mu_);
    FleetWeights before;
    {
      absl::MutexLock lock(&mu_);
      before = fleet_;
      fleet_ = fleet;
      for (const Entry& e : entries_) all.push_back(e.worker);
    }
    for (FleetObserver* o : observers_) o->OnFleetWeights(before, fleet);
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
  for (const Entry& e : entries_) {
    if (e.worker.get() == w) return e.state.Behind(fleet_.version);
  }
  return false;
}

void WorkerPool::SetCatchUpHandler(CatchUpHandler handler) {
  absl::MutexLock lock(&handoff_mu_);
  catch_up_ = std::move(handler);
}

void WorkerPool::AddObserver(FleetObserver* observer) {
  absl::MutexLock lock(&handoff_mu_);
  observers_.push_back(observer);
}

void WorkerPool::RemoveObserver(FleetObserver* observer) {
  absl::MutexLock lock(&handoff_mu_);
  observers_.erase(std::remove(observers_.begin(), observers_.end(), observer), observers_.end());
}

void WorkerPool::FinishSync(Worker* w) {
  absl::MutexLock lock(&mu_);
  if (Entry* e = FindLocked(w)) e->state.FinishSync();
}

void WorkerPool::MaybeCatchUp(const std::shared_ptr<Worker>& w) {
  {
    absl::MutexLock lock(&mu_);
    Entry* e = FindLocked(w.get());
    if (e == nullptr) return;
    const bool behind_replayable = fleet_.replayable() && e->state.Behind(fleet_.version);
    if (!e->state.TakeForCatchUp(behind_replayable)) return;
  }
  bool handled = false;
  {
    absl::MutexLock lock(&handoff_mu_);
    if (catch_up_) {
      catch_up_(w);
      handled = true;
    }
  }
  if (!handled) FinishSync(w.get());
}

}  // namespace rl::router
