#include "services/router/worker_pool.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "spdlog/spdlog.h"

namespace rl::router {

Worker::Worker(std::string address) : address_(std::move(address)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(512 << 20);
  args.SetMaxSendMessageSize(512 << 20);
  channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
  worker_stub_ = rl::v1::Worker::NewStub(channel_);
  admin_stub_ = rl::v1::Admin::NewStub(channel_);
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
    workers_.push_back(w);
    std::sort(workers_.begin(), workers_.end(),
              [](const auto& a, const auto& b) { return a->address() < b->address(); });
  }
  spdlog::info("worker {} added", address);
  // Let a freshly added worker serve at once when it is healthy.
  for (int i = 0; i < options_.success_threshold; ++i) CheckOne(w);
  return absl::OkStatus();
}

absl::Status WorkerPool::Remove(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = std::find_if(workers_.begin(), workers_.end(),
                         [&](const auto& w) { return w->address() == address; });
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("address: no worker '", address, "'"));
  (*it)->removed_ = true;
  workers_.erase(it);
  spdlog::info("worker {} removed", address);
  return absl::OkStatus();
}

absl::Status WorkerPool::SetEnabled(const std::string& address, bool enabled) {
  absl::MutexLock lock(&mu_);
  for (const auto& w : workers_) {
    if (w->address() == address) {
      w->enabled_ = enabled;
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("address: no worker '", address, "'"));
}

std::vector<rl::v1::WorkerStatus> WorkerPool::List() const {
  absl::MutexLock lock(&mu_);
  const int64_t current = CurrentVersionLocked();
  std::vector<rl::v1::WorkerStatus> out;
  for (const auto& w : workers_) {
    rl::v1::WorkerStatus s;
    s.set_address(w->address());
    s.set_state(w->live_ ? rl::v1::WORKER_STATE_LIVE : rl::v1::WORKER_STATE_DEAD);
    s.set_enabled(w->enabled_);
    s.set_in_flight(w->in_flight());
    s.set_weight_version(w->weight_version_);
    s.set_version_mismatch(w->weight_version_ >= 0 && current >= 0 && w->weight_version_ != current);
    s.set_consecutive_failures(w->failures_);
    s.set_requests_served(w->served_.load());
    out.push_back(std::move(s));
  }
  return out;
}

Lease WorkerPool::Pick(const std::set<std::string>& exclude) {
  absl::MutexLock lock(&mu_);
  const size_t n = workers_.size();
  for (size_t i = 0; i < n; ++i) {
    const std::shared_ptr<Worker>& w = workers_[(next_ + i) % n];
    if (w->live_ && w->enabled_ && w->serving_ && !exclude.contains(w->address())) {
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

void WorkerPool::ReportFailure(Worker* w) {
  absl::MutexLock lock(&mu_);
  w->successes_ = 0;
  if (++w->failures_ >= options_.failure_threshold && w->live_) {
    w->live_ = false;
    spdlog::warn("worker {} marked dead after {} failures", w->address(), w->failures_);
  }
}

void WorkerPool::ReportVersion(Worker* w, int64_t version) {
  absl::MutexLock lock(&mu_);
  w->weight_version_ = version;
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

void WorkerPool::CheckOne(const std::shared_ptr<Worker>& w) {
  const auto deadline = std::chrono::system_clock::now() + options_.health_timeout;
  grpc::health::v1::HealthCheckResponse health;
  grpc::ClientContext hctx;
  hctx.set_deadline(deadline);
  auto health_stub = grpc::health::v1::Health::NewStub(w->channel());
  grpc::Status s = health_stub->Check(&hctx, grpc::health::v1::HealthCheckRequest(), &health);
  // NOT_SERVING (asleep, or a weight update in progress) is not a failure of the process: the
  // worker keeps its state; only unreachable workers die.
  rl::v1::GetLoadResponse load;
  if (s.ok()) {
    grpc::ClientContext lctx;
    lctx.set_deadline(deadline);
    s = w->worker_stub().GetLoad(&lctx, rl::v1::GetLoadRequest(), &load);
    // A data-plane key may guard GetLoad; the process is reachable all the same.
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      s = grpc::Status::OK;
      load.set_weight_version(w->weight_version_);
    }
  }
  absl::MutexLock lock(&mu_);
  if (w->removed_) return;
  if (!s.ok()) {
    w->successes_ = 0;
    if (++w->failures_ >= options_.failure_threshold && w->live_) {
      w->live_ = false;
      spdlog::warn("worker {} dead: {}", w->address(), s.error_message());
    }
    return;
  }
  w->failures_ = 0;
  w->weight_version_ = load.weight_version();
  w->serving_ = health.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  if (w->live_) return;
  ++w->successes_;
  const int64_t current = CurrentVersionLocked();
  if (w->successes_ >= options_.success_threshold &&
      (current < 0 || w->weight_version_ >= current)) {
    w->live_ = true;
    w->successes_ = 0;
    spdlog::info("worker {} live (weight_version {})", w->address(), w->weight_version_);
  }
}

void WorkerPool::CheckAll() {
  std::vector<std::shared_ptr<Worker>> all;
  {
    absl::MutexLock lock(&mu_);
    all = workers_;
  }
  for (const auto& w : all) CheckOne(w);
}

void WorkerPool::HealthLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(options_.health_interval));
    if (stop_) break;
    mu_.Unlock();
    CheckAll();
    mu_.Lock();
  }
}

}  // namespace rl::router
