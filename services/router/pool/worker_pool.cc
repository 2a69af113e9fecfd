#include "services/router/pool/worker_pool.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "services/router/pool/policies/round_robin.h"
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
      policy_(policy != nullptr ? std::move(policy) : MakeRoundRobinPolicy()),
      policy_config_{policy_->name(), policy_->load_factor(), policy_->load_slack()} {
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

namespace {

absl::Status CheckHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address: '", address, "' is not HOST:PORT"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WorkerPool::Add(const std::string& address) {
  RETURN_IF_ERROR(CheckHostPort(address));
  {
    absl::MutexLock lock(&mu_);
    if (FindLocked(address) != nullptr) return absl::OkStatus();
  }
  Insert(std::make_shared<Worker>(address), nullptr);
  return absl::OkStatus();
}

absl::Status WorkerPool::AddChecked(const std::string& address, bool allow_unreachable) {
  RETURN_IF_ERROR(CheckHostPort(address));
  {
    absl::MutexLock lock(&mu_);
    if (FindLocked(address) != nullptr) return absl::OkStatus();
  }
  auto w = std::make_shared<Worker>(address);
  const HealthReport report = health_->Check(w);
  if (!report.reachable && report.not_a_worker) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: '", address, "' is not an rl-worker: ", report.error));
  }
  if (!report.reachable && !allow_unreachable) {
    return absl::UnavailableError(absl::StrCat(
        "address: no rl-worker answered at '", address, "' within ",
        options_.health_timeout.count(), " ms (", report.error,
        "); AddWorker registers only workers that answer: start it first, or add it with "
        "allow_unreachable (rlctl workers add --allow-unreachable ADDR) to register one that is "
        "still starting"));
  }
  Insert(w, &report);
  return absl::OkStatus();
}

void WorkerPool::Insert(const std::shared_ptr<Worker>& w, const HealthReport* first) {
  {
    absl::MutexLock lock(&mu_);
    if (FindLocked(w->address()) != nullptr) return;  // added meanwhile
    auto at = std::lower_bound(
        entries_.begin(), entries_.end(), w->address(),
        [](const Entry& e, const std::string& a) { return e.worker->address() < a; });
    entries_.insert(at, Entry{w, WorkerState()});
  }
  spdlog::info("worker {} added", w->address());
  // Let a freshly added worker serve at once when it is healthy.
  int probes = 0;
  if (first != nullptr) {
    ApplyCheck(w, *first);
    ++probes;
  }
  for (; probes < options_.success_threshold; ++probes) Probe(w);
  NotifyCapacity();
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
  NotifyCapacity();
  return absl::OkStatus();
}

absl::Status WorkerPool::SetEnabled(const std::string& address, bool enabled) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindLocked(address);
  if (e == nullptr) return NoWorker(address);
  e->state.SetEnabled(enabled);
  return absl::OkStatus();
}

std::string WorkerPool::VersionReasonLocked(const Entry& e, int64_t reference) const {
  const WorkerState& st = e.state;
  const std::string& address = e.worker->address();
  if (st.Behind(fleet_.version)) {
    const std::string behind = absl::StrCat("weight_version ", st.weight_version(),
                                            " is behind the fleet's ", fleet_.version);
    if (fleet_.replayable()) return absl::StrCat(behind, "; catching up from ", fleet_.path);
    const char* from = "a distributed group";
    if (fleet_.source == FleetWeights::Source::kTensor) from = "a tensor stream";
    if (fleet_.source == FleetWeights::Source::kAdopted) {
      from = "a worker's version an operator adopted without its folder";
    }
    if (CatchableLocked(e)) {
      return absl::StrCat(behind, ", which came from ", from,
                          "; catching up from a live peer at weight_version ", fleet_.version);
    }
    return absl::StrCat(behind, ", which came from ", from,
                        " the router cannot replay, and no live worker serves it to send it; "
                        "resync it: rlctl workers resync ",
                        address, " --from-disk DIR");
  }
  if (fleet_.version >= 0 && st.weight_version() > fleet_.version) {
    return absl::StrCat(
        "weight_version ", st.weight_version(), " is ahead of the fleet's ", fleet_.version,
        " (an update the router did not record: sent to it alone, or the router restarted in "
        "the middle of a fleet update): not routed until an operator decides: resync it "
        "(rlctl workers resync ",
        address, " --from-disk DIR) or adopt its version as the fleet's (rlctl workers adopt ",
        address, " [--from-disk DIR])");
  }
  if (fleet_.version >= 0) {
    return absl::StrCat(
        "weight_version ", st.weight_version(), " differs from the fleet's ", reference,
        " (it was updated outside the router's fleet-wide updates): not routed "
        "until it serves ",
        reference, "; resync it: rlctl workers resync ", address, " --from-disk DIR");
  }
  return absl::StrCat("weight_version ", st.weight_version(), " differs from ", reference,
                      ", the newest version among live workers (no fleet update recorded yet): "
                      "not routed until it serves ",
                      reference,
                      "; update the whole fleet (rlctl update-weights --from-disk DIR) to bring "
                      "every worker to one version");
}

rl::v1::WorkerStatus WorkerPool::StatusLocked(const Entry& e, int64_t reference) const {
  const WorkerState& st = e.state;
  rl::v1::WorkerStatus s;
  s.set_address(e.worker->address());
  std::vector<std::string> why;
  if (!st.live()) {
    s.set_state(rl::v1::WORKER_STATE_DEAD);
    why.push_back(st.last_error().empty() ? "dead" : st.last_error());
  } else if (st.Behind(fleet_.version)) {
    s.set_state(CatchableLocked(e) ? rl::v1::WORKER_STATE_SYNCING : rl::v1::WORKER_STATE_STALE);
    why.push_back(VersionReasonLocked(e, reference));
  } else if (st.Differs(reference)) {
    s.set_state(rl::v1::WORKER_STATE_VERSION_MISMATCH);
    why.push_back(VersionReasonLocked(e, reference));
  } else if (DigestDiffersLocked(e)) {
    s.set_state(rl::v1::WORKER_STATE_VERSION_MISMATCH);
    why.push_back(absl::StrCat(
        "weights_sha256 ", st.weights_sha256(), " at weight_version ", st.weight_version(),
        " differs from the fleet's ", reference_digest_,
        " (the same version number with other content: an update that reused the number, or "
        "one the router did not make): not routed; resync it: rlctl workers resync ",
        e.worker->address(), " --from-disk DIR"));
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
  if (st.live() && st.paused() && !fleet_paused_) {
    why.push_back(
        "paused while the fleet is not (paused directly?): out of routing until continued");
  }
  s.set_reason(absl::StrJoin(why, "; "));
  s.set_enabled(st.enabled());
  s.set_in_flight(e.worker->in_flight());
  s.set_weight_version(st.weight_version());
  s.set_version_mismatch(st.weight_version() >= 0 && st.Differs(reference));
  s.set_consecutive_failures(st.failures());
  s.set_requests_served(e.worker->served());
  s.set_load(e.worker->load());
  s.set_prompt_tokens(e.worker->prompt_tokens());
  s.set_cached_prompt_tokens(e.worker->cached_tokens());
  s.set_kv_usage(e.worker->kv_usage());
  return s;
}

std::vector<rl::v1::WorkerStatus> WorkerPool::List() const {
  absl::MutexLock lock(&mu_);
  const int64_t reference = ReferenceVersionLocked();
  std::vector<rl::v1::WorkerStatus> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_) out.push_back(StatusLocked(e, reference));
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

bool WorkerPool::DigestDiffersLocked(const Entry& e) const {
  const WorkerState& st = e.state;
  return st.live() && !reference_digest_.empty() && st.weight_version() == digest_version_ &&
         !st.weights_sha256().empty() && st.weights_sha256() != reference_digest_;
}

bool WorkerPool::RoutableLocked(const Entry& e, int64_t reference) const {
  return e.state.Routable(reference) && !DigestDiffersLocked(e);
}

void WorkerPool::LearnDigestLocked() {
  const int64_t reference = ReferenceVersionLocked();
  if (reference != digest_version_) {
    digest_version_ = reference;
    reference_digest_.clear();
  }
  if (reference < 0) return;
  // The digest most live workers at the version report (a tie keeps the one held): a single
  // worker with other weights that happened to report first is outvoted as soon as the others
  // report, instead of taking every healthy worker out.
  absl::flat_hash_map<std::string, int> votes;
  for (const Entry& e : entries_) {
    if (e.state.liveness() == Liveness::kLive && e.state.enabled() &&
        e.state.weight_version() == reference && !e.state.weights_sha256().empty()) {
      ++votes[e.state.weights_sha256()];
    }
  }
  std::string best = reference_digest_;
  int best_votes = votes.contains(best) ? votes[best] : 0;
  for (const auto& [digest, n] : votes) {
    if (n > best_votes) {
      best = digest;
      best_votes = n;
    }
  }
  if (best_votes == 0 || best == reference_digest_) return;
  reference_digest_ = best;
  spdlog::info("fleet weights digest at weight_version {}: {} (reported by {} live worker(s))",
               reference, reference_digest_, best_votes);
}

bool WorkerPool::EligibleLocked(const Entry& e, const PickRequest& request,
                                int64_t reference) const {
  return RoutableLocked(e, reference) && (!e.state.paused() || fleet_paused_) &&
         request.versions.Accepts(e.state.weight_version()) &&
         (request.exclude == nullptr || !request.exclude->contains(e.worker->address()));
}

std::vector<int64_t> WorkerPool::RoutableVersions() const {
  absl::MutexLock lock(&mu_);
  const int64_t reference = ReferenceVersionLocked();
  std::vector<int64_t> out;
  for (const Entry& e : entries_) {
    if (RoutableLocked(e, reference)) out.push_back(e.state.weight_version());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Lease WorkerPool::Pick(const PickRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::InlinedVector<Candidate, 16> candidates;
  absl::InlinedVector<Entry*, 16> entries;
  const int64_t reference = ReferenceVersionLocked();
  for (Entry& e : entries_) {
    if (!EligibleLocked(e, request, reference)) continue;
    candidates.push_back({e.worker.get(), &e.worker->address(), e.worker->in_flight(),
                          e.worker->load(), e.worker->kv_usage(), e.state.weight_version()});
    entries.push_back(&e);
  }
  while (!candidates.empty()) {
    Choice choice = policy_->Choose(request, candidates);
    choice.index = std::min(choice.index, candidates.size() - 1);
    const size_t i = choice.index;
    Entry* e = entries[i];
    if (e->worker->channel()->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
      e->worker->CountServed();
      RecordPickLocked(choice, candidates, request.units);
      return Lease(e->worker, request.units);
    }
    // The connection dropped since the last check: verify process and version first.
    e->state.OnConnectionLost();
    health_->Wake();
    candidates.erase(candidates.begin() + static_cast<std::ptrdiff_t>(i));
    entries.erase(entries.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return Lease();
}

void WorkerPool::RecordPickLocked(const Choice& choice, absl::Span<const Candidate> candidates,
                                  int32_t units) {
  ++routing_stats_.picks;
  if (choice.keyed) ++routing_stats_.keyed_picks;
  if (choice.moved) ++routing_stats_.key_moves;
  int64_t total = 0, max = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const int64_t load = candidates[i].load + (i == choice.index ? std::max(units, 1) : 0);
    total += load;
    max = std::max(max, load);
  }
  load_spread_sum_ += static_cast<double>(max) * static_cast<double>(candidates.size()) /
                      static_cast<double>(total);
}

RoutingStats WorkerPool::routing_stats() const {
  absl::MutexLock lock(&mu_);
  RoutingStats s = routing_stats_;
  s.mean_load_spread = s.picks > 0 ? load_spread_sum_ / static_cast<double>(s.picks) : 0;
  return s;
}

double WorkerPool::LoadSpread() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0, max = 0, n = 0;
  for (const Entry& e : entries_) {
    if (!e.state.Routable(fleet_.version)) continue;
    ++n;
    total += e.worker->load();
    max = std::max<int64_t>(max, e.worker->load());
  }
  return total > 0 ? static_cast<double>(max) * static_cast<double>(n) / static_cast<double>(total)
                   : 0;
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
    case WorkerState::Change::kRestarted:
      // The calls to the old process are lost with it: end them now (retried elsewhere where
      // possible) rather than when their transport notices; new calls go to the new process.
      e->worker->calls().CancelAll(
          absl::StrCat("worker ", e->worker->address(), " restarted (a new instance_id)"));
      e->worker->calls().Reopen();
      spdlog::warn(
          "worker {} restarted since its last health check (instance {}; weight_version "
          "{}): rejoining",
          e->worker->address(), e->state.instance_id(), e->state.weight_version());
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
    LearnDigestLocked();
    WarnVersionsLocked();
    if (!CatchableLocked(*e)) return;
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
    LearnDigestLocked();
    WarnVersionsLocked();
  }
  NotifyCapacity();
  MaybeCatchUp(w);
}

int64_t WorkerPool::NewestLiveVersionLocked() const {
  int64_t v = -1;
  for (const Entry& e : entries_) {
    if (e.state.live()) v = std::max(v, e.state.weight_version());
  }
  return v;
}

int64_t WorkerPool::ReferenceVersionLocked() const {
  if (fleet_.version >= 0) return fleet_.version;
  // No update recorded: the newest version among live workers an operator has not taken out
  // (a disabled worker does not decide what the fleet serves).
  int64_t v = -1;
  for (const Entry& e : entries_) {
    if (e.state.live() && e.state.enabled()) v = std::max(v, e.state.weight_version());
  }
  return v;
}

int64_t WorkerPool::ReferenceVersion() const {
  absl::MutexLock lock(&mu_);
  return ReferenceVersionLocked();
}

void WorkerPool::EndHold() {
  if (holds_.fetch_sub(1) != 1) return;
  absl::MutexLock lock(&mu_);
  WarnVersionsLocked();
}

void WorkerPool::WarnVersionsLocked() {
  if (holds_.load() > 0) return;
  const int64_t reference = ReferenceVersionLocked();
  for (Entry& e : entries_) {
    if (!e.state.live()) continue;
    const bool differs = e.state.Differs(reference);
    if (differs && !e.version_warned) {
      spdlog::warn("worker {} is not routed: {}", e.worker->address(),
                   VersionReasonLocked(e, reference));
    }
    e.version_warned = differs;
    const bool digest = DigestDiffersLocked(e);
    if (digest && !e.digest_warned) {
      spdlog::warn(
          "worker {} is not routed: weights_sha256 {} at weight_version {} differs from "
          "the fleet's {}",
          e.worker->address(), e.state.weights_sha256(), e.state.weight_version(),
          reference_digest_);
    }
    e.digest_warned = digest;
  }
}

// ---- capacity ----

int64_t WorkerPool::CapacityLocked() const {
  int64_t n = 0;
  for (const Entry& e : entries_) {
    const int32_t m = e.state.max_running_requests();
    n += m > 0 ? m : kDefaultWorkerCapacity;
  }
  return n;
}

int64_t WorkerPool::Capacity() const {
  absl::MutexLock lock(&mu_);
  return CapacityLocked();
}

void WorkerPool::SetCapacityObserver(std::function<void(int64_t)> observer) {
  absl::MutexLock lock(&capacity_mu_);
  capacity_observer_ = std::move(observer);
  notified_capacity_ = -1;
}

void WorkerPool::NotifyCapacity() {
  int64_t capacity;
  {
    absl::MutexLock lock(&mu_);
    capacity = CapacityLocked();
  }
  absl::MutexLock lock(&capacity_mu_);
  if (!capacity_observer_ || capacity == notified_capacity_) return;
  notified_capacity_ = capacity;
  capacity_observer_(capacity);
}

int64_t WorkerPool::DigestMismatches() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const Entry& e : entries_) n += DigestDiffersLocked(e) ? 1 : 0;
  return n;
}

std::string WorkerPool::ReferenceDigest() const {
  absl::MutexLock lock(&mu_);
  return reference_digest_;
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
  {
    absl::MutexLock lock(&mu_);
    LearnDigestLocked();
    WarnVersionsLocked();
  }
  spdlog::info("fleet weights: version {} from {}", fleet.version, fleet.Describe());
  for (const auto& w : all) MaybeCatchUp(w);
}

absl::StatusOr<FleetWeights> WorkerPool::AdoptWorkerVersion(const std::string& address,
                                                            const std::string& model_path) {
  if (held()) {
    return absl::FailedPreconditionError(
        "an admin broadcast is running (versions move): adopt once it has ended");
  }
  FleetWeights fleet;
  {
    absl::MutexLock lock(&mu_);
    const Entry* e = FindLocked(address);
    if (e == nullptr) return NoWorker(address);
    const WorkerState& st = e->state;
    if (st.liveness() != Liveness::kLive) {
      return absl::FailedPreconditionError(absl::StrCat(
          "address: worker ", address, " is ", LivenessName(st.liveness()),
          ": only a live worker's version can be adopted (its version is what it reports)"));
    }
    if (st.weight_version() < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("address: worker ", address, " has not reported a weight version yet"));
    }
    if (st.weight_version() <= fleet_.version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "address: worker ", address, " serves weight_version ", st.weight_version(),
          ", not ahead of the fleet's ", fleet_.version,
          ": only a newer version can be adopted (a worker behind is caught up or resynced)"));
    }
    fleet.version = st.weight_version();
    if (model_path.empty()) {
      fleet.source = FleetWeights::Source::kAdopted;
      fleet.path = address;
    } else {
      fleet.source = FleetWeights::Source::kDisk;
      fleet.path = model_path;
    }
  }
  spdlog::warn("operator adopted worker {}'s weight_version {} as the fleet's (from {})", address,
               fleet.version, fleet.Describe());
  SetFleetWeights(fleet);
  return fleet;
}

FleetWeights WorkerPool::fleet_weights() const {
  absl::MutexLock lock(&mu_);
  return fleet_;
}

void WorkerPool::SetFleetPaused(bool paused) {
  absl::MutexLock handoff(&handoff_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (fleet_paused_ == paused) return;
    fleet_paused_ = paused;
    if (!paused) {
      for (Entry& e : entries_) e.state.ClearPaused();
    }
  }
  for (FleetObserver* o : observers_) o->OnFleetPaused(paused);
  spdlog::info("fleet {}", paused ? "paused" : "running");
}

bool WorkerPool::fleet_paused() const {
  absl::MutexLock lock(&mu_);
  return fleet_paused_;
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

bool WorkerPool::IsPeerLocked(const Entry& e, int64_t version) const {
  const WorkerState& st = e.state;
  return st.liveness() == Liveness::kLive && st.enabled() && st.serving() && !st.syncing() &&
         version >= 0 && st.weight_version() == version;
}

bool WorkerPool::CatchableLocked(const Entry& e) const {
  if (!e.state.Behind(fleet_.version)) return false;
  if (fleet_.replayable()) return true;
  for (const Entry& peer : entries_) {
    if (&peer != &e && IsPeerLocked(peer, fleet_.version)) return true;
  }
  return false;
}

std::vector<std::shared_ptr<Worker>> WorkerPool::PeersAt(int64_t version,
                                                         const Worker* except) const {
  absl::MutexLock lock(&mu_);
  std::vector<const Entry*> peers;
  for (const Entry& e : entries_) {
    if (e.worker.get() != except && IsPeerLocked(e, version)) peers.push_back(&e);
  }
  std::stable_sort(peers.begin(), peers.end(), [](const Entry* a, const Entry* b) {
    return a->worker->load() < b->worker->load();
  });
  std::vector<std::shared_ptr<Worker>> out;
  out.reserve(peers.size());
  for (const Entry* e : peers) out.push_back(e->worker);
  return out;
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
    if (!e->state.TakeForCatchUp(CatchableLocked(*e))) return;
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
