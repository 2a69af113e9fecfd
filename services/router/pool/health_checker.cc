#include "services/router/pool/health_checker.h"

#include <utility>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace rl::router {
namespace {

// The worker's readiness service on grpc.health.v1 (its overall status is liveness only, SERVING
// through updates and sleep). A worker that has no such service (an older build, a fake) answers
// NOT_FOUND: its overall status is asked instead.
constexpr char kReadinessService[] = "rl.v1.Worker";

// One check in flight: gRPC health (readiness), then GetLoad for the version, asynchronous.
struct ProbeCall {
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub;
  grpc::ClientContext hctx;
  grpc::ClientContext overall_ctx;  // the NOT_FOUND fallback's
  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckRequest overall_req;
  grpc::health::v1::HealthCheckResponse health;
  grpc::ClientContext lctx;
  rl::v1::GetLoadRequest lreq;
  rl::v1::GetLoadResponse load;
};

}  // namespace

HealthChecker::HealthChecker(const HealthCheckOptions& options, Targets targets, Sink sink)
    : options_(options), targets_(std::move(targets)), sink_(std::move(sink)) {
  thread_ = std::thread([this] { Loop(); });
}

HealthChecker::~HealthChecker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void HealthChecker::ProbeAsync(const std::shared_ptr<Worker>& w, std::function<void()> done) {
  CheckAsync(w, [this, w, done = std::move(done)](const HealthReport& report) {
    sink_(w, report);
    done();
  });
}

HealthReport HealthChecker::Check(const std::shared_ptr<Worker>& w) {
  absl::Notification done;
  HealthReport out;
  CheckAsync(w, [&](const HealthReport& report) {
    out = report;
    done.Notify();
  });
  done.WaitForNotification();
  return out;
}

void HealthChecker::CheckAsync(const std::shared_ptr<Worker>& w,
                               std::function<void(const HealthReport&)> on_report) {
  const auto deadline = std::chrono::system_clock::now() + options_.timeout;
  auto call = std::make_shared<ProbeCall>();
  call->health_stub = grpc::health::v1::Health::NewStub(w->channel());
  call->hctx.set_deadline(deadline);
  call->overall_ctx.set_deadline(deadline);
  call->lctx.set_deadline(deadline);
  call->hreq.set_service(kReadinessService);
  auto finish = [call, w, on_report = std::move(on_report)](const grpc::Status& s,
                                                            bool version_known) {
    HealthReport report;
    report.reachable = s.ok();
    if (!s.ok()) {
      report.error = s.error_message();
      report.not_a_worker = s.error_code() == grpc::StatusCode::UNIMPLEMENTED;
    }
    report.serving = call->health.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    if (s.ok() && version_known) {
      report.weight_version = call->load.weight_version();
      report.max_running_requests = call->load.max_running_requests();
      w->set_kv_usage(call->load.kv_usage());  // least_load's second criterion
      report.paused = call->load.paused();
      report.instance_id = call->load.instance_id();
      report.weights_sha256 = call->load.weights_sha256();
    }
    on_report(report);
  };
  // After health answered: GetLoad for the version.
  auto load = [w, call, finish = std::move(finish)](grpc::Status s) mutable {
    // NOT_SERVING (asleep, a weight update in progress, draining) is not a failure of the
    // process: the worker keeps its state; only unreachable workers die.
    if (!s.ok()) {
      finish(s, true);
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
          if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
            finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                "it answers gRPC health but has no rl.v1.Worker service: not "
                                "an rl-worker (an rl-router?)"),
                   false);
            return;
          }
          finish(s, true);
        });
  };
  call->health_stub->async()->Check(
      &call->hctx, &call->hreq, &call->health,
      [call, load = std::move(load)](grpc::Status s) mutable {
        if (s.error_code() != grpc::StatusCode::NOT_FOUND) {
          load(s);
          return;
        }
        call->health_stub->async()->Check(
            &call->overall_ctx, &call->overall_req, &call->health,
            [load = std::move(load)](grpc::Status s) mutable { load(s); });
      });
}

void HealthChecker::Probe(const std::shared_ptr<Worker>& w) {
  absl::Notification done;
  ProbeAsync(w, [&done] { done.Notify(); });
  done.WaitForNotification();
}

void HealthChecker::CheckAll() {
  const std::vector<std::shared_ptr<Worker>> all = targets_();
  // All at once, asynchronously: a round costs one health timeout at most, on no thread of its
  // own.
  absl::BlockingCounter pending(static_cast<int>(all.size()));
  for (const auto& w : all) ProbeAsync(w, [&pending] { pending.DecrementCount(); });
  pending.Wait();
}

void HealthChecker::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

void HealthChecker::Loop() {
  absl::MutexLock lock(&mu_);
  auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || wake_; };
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&wake), absl::FromChrono(options_.interval));
    if (stop_) break;
    wake_ = false;
    mu_.Unlock();
    CheckAll();
    mu_.Lock();
  }
}

}  // namespace rl::router
