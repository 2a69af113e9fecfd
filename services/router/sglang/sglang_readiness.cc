#include "services/router/sglang/sglang_readiness.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace rl::router {

SglangReadiness SglangReadinessOf(const WorkerPool& pool, bool draining) {
  if (draining) {
    return {false, "rl-router is draining (shutting down): send new requests to another replica"};
  }
  const std::vector<rl::v1::WorkerStatus> workers = pool.List();
  int routable = 0;
  const rl::v1::WorkerStatus* first_out = nullptr;
  for (const rl::v1::WorkerStatus& w : workers) {
    if (w.state() == rl::v1::WORKER_STATE_LIVE && w.reason().empty()) {
      ++routable;
    } else if (first_out == nullptr) {
      first_out = &w;
    }
  }
  if (routable > 0) return {true, absl::StrCat("rl-router: ", routable, " routable workers")};
  if (first_out == nullptr) return {false, "rl-router: no routable worker (none registered)"};
  // The first worker's reason, bounded: enough for an operator to start from.
  std::string why = first_out->reason().substr(0, 200);
  return {false, absl::StrCat("rl-router: no routable worker (", workers.size(), " registered; ",
                              first_out->address(), ": ", why, ")")};
}

ReadinessWatch::ReadinessWatch(std::function<bool()> ready, std::function<void(bool)> publish,
                               std::chrono::milliseconds interval)
    : ready_(std::move(ready)), publish_(std::move(publish)), interval_(interval) {
  Refresh();
  thread_ = std::thread([this] { Loop(); });
}

ReadinessWatch::~ReadinessWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void ReadinessWatch::Refresh() {
  absl::MutexLock lock(&mu_);
  if (!stop_) EvaluateLocked();
}

void ReadinessWatch::EvaluateLocked() {
  const bool ready = ready_();
  if (published_ == ready) return;
  published_ = ready;
  publish_(ready);
}

void ReadinessWatch::Loop() {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(interval_))) {
    EvaluateLocked();
  }
}

}  // namespace rl::router
