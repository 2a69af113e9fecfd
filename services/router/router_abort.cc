// Router.Abort: one in-flight request by id, forwarded to the worker that holds it, every
// request of a GRPO group (group_id: one forward per member in flight, issue 34's
// over-sampling), or every request on every live worker (abort_all, admin key). Kept apart
// from router_service.cc.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "grpcpp/alarm.h"
#include "services/router/generation.h"
#include "services/router/pool/worker_pool.h"
#include "services/router/router_service.h"
#include "spdlog/spdlog.h"

namespace rl::router {
namespace {

// How long a forwarded abort that found nothing on the worker is repeated: the worker may not
// have registered the request yet when the abort overtakes it.
constexpr int kForwardTries = 40;
constexpr std::chrono::milliseconds kForwardPause{50};
constexpr std::chrono::seconds kForwardDeadline{10};
// Router.Abort calls forwarding at once: at most this many, the rest are refused
// (RESOURCE_EXHAUSTED), so a burst of aborts cannot grow the router's memory without bound.
constexpr int kMaxAbortsInFlight = 64;

// One Router.Abort being forwarded, on the asynchronous client API: worker calls and the pauses
// between tries (gRPC alarms) hold no thread, so an abort storm against a hung worker delays
// nothing else (admin broadcasts run on the admin executor). Deletes itself after `done`.
class AbortForward {
 public:
  using Done = std::function<void(absl::StatusOr<int32_t>)>;
  AbortForward(RouterService* svc, const rl::v1::AbortRequest& request,
               std::optional<std::string> authorization, Done done)
      : svc_(svc),
        request_(request),
        authorization_(std::move(authorization)),
        done_(std::move(done)) {}

  void Start() {
    if (request_.abort_all()) {
      StartAll();
    } else {
      TryOne();
    }
  }

 private:
  // One forwarded call: context, answer, outcome.
  struct Call {
    grpc::ClientContext ctx;
    rl::v1::AbortResponse response;
    grpc::Status status;
  };

  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() + kForwardDeadline);
    if (authorization_) ctx->AddMetadata("authorization", *authorization_);
  }

  // abort_all: every live worker gets it, also past one that fails; the first failure (in
  // address order) is returned, else the total.
  void StartAll() {
    svc_->requests()->MarkAllAborted();
    request_.Clear();
    request_.set_abort_all(true);
    workers_ = svc_->pool()->LiveWorkers();
    if (workers_.empty()) {
      Finish(0);
      return;
    }
    calls_ = std::make_unique<Call[]>(workers_.size());
    // One more than the calls: the loop's own, so a callback run early cannot end (and delete)
    // this before every call has started.
    pending_.store(static_cast<int>(workers_.size()) + 1);
    for (size_t i = 0; i < workers_.size(); ++i) {
      Call* c = &calls_[i];
      Prepare(&c->ctx);
      workers_[i]->worker_stub().async()->Abort(&c->ctx, &request_, &c->response,
                                                [this, c](grpc::Status s) {
                                                  c->status = std::move(s);
                                                  if (pending_.fetch_sub(1) == 1) EndAll();
                                                });
    }
    if (pending_.fetch_sub(1) == 1) EndAll();
  }

  void EndAll() {
    int32_t total = 0;
    for (size_t i = 0; i < workers_.size(); ++i) {
      const Call& c = calls_[i];
      if (!c.status.ok()) {
        Finish(Annotate(FromGrpcStatus(c.status), absl::StrCat("worker ", workers_[i]->address())));
        return;
      }
      total += c.response.num_aborted();
    }
    Finish(total);
  }

  // One request by id: forwarded to the worker that holds it now, repeated (kForwardTries,
  // kForwardPause apart) while the worker reports nothing aborted.
  void TryOne() {
    if (tries_ == kForwardTries) {
      spdlog::warn("Router.Abort: worker never reported request '{}' aborted",
                   request_.request_id());
      Finish(0);
      return;
    }
    ++tries_;
    absl::StatusOr<std::string> address = svc_->requests()->MarkAborted(request_.request_id());
    // Between two attempts: the mark alone stops the request.
    if (!address.ok() || address->empty()) {
      Finish(address.ok() ? absl::StatusOr<int32_t>(0) : address.status());
      return;
    }
    std::shared_ptr<Worker> worker = svc_->pool()->Find(*address);
    if (worker == nullptr) {
      Finish(0);
      return;
    }
    address_ = *std::move(address);
    workers_.assign(1, std::move(worker));
    calls_ = std::make_unique<Call[]>(1);
    Call* c = &calls_[0];
    Prepare(&c->ctx);
    workers_[0]->worker_stub().async()->Abort(
        &c->ctx, &request_, &c->response, [this, c](grpc::Status s) {
          if (!s.ok()) {
            Finish(Annotate(FromGrpcStatus(s), absl::StrCat("worker ", address_)));
          } else if (c->response.num_aborted() > 0) {
            Finish(c->response.num_aborted());
          } else {
            Pause();
          }
        });
  }

  void Pause() {
    // A fresh alarm per pause: the one whose callback runs now may be destroyed here.
    alarm_ = std::make_unique<grpc::Alarm>();
    alarm_->Set(std::chrono::system_clock::now() + kForwardPause, [this](bool) { TryOne(); });
  }

  void Finish(absl::StatusOr<int32_t> n) {
    Done done = std::move(done_);
    delete this;
    done(std::move(n));
  }

  RouterService* svc_;
  rl::v1::AbortRequest request_;
  const std::optional<std::string> authorization_;
  Done done_;
  std::vector<std::shared_ptr<Worker>> workers_;  // the calls' targets, kept alive
  std::unique_ptr<Call[]> calls_;
  std::atomic<int> pending_{0};
  int tries_ = 0;
  std::string address_;
  std::unique_ptr<grpc::Alarm> alarm_;
};

// group_id: every member in flight is marked (a member between attempts stops on the mark
// alone) and forwarded like one id; the total of what the workers aborted is returned (at
// least the members marked). A member that registers after the call is not aborted.
class GroupAbort {
 public:
  using Done = AbortForward::Done;
  static void Start(RouterService* svc, const std::string& group_id,
                    std::optional<std::string> authorization, Done done) {
    std::vector<std::string> ids = svc->requests()->MarkGroupAborted(group_id);
    if (ids.empty()) {
      done(0);
      return;
    }
    auto* g = new GroupAbort(static_cast<int>(ids.size()), std::move(done));
    for (const std::string& id : ids) {
      rl::v1::AbortRequest one;
      one.set_request_id(id);
      (new AbortForward(svc, one, authorization, [g](absl::StatusOr<int32_t> n) {
        g->One(n);
      }))->Start();
    }
  }

 private:
  GroupAbort(int members, Done done)
      : pending_(members), marked_(members), done_(std::move(done)) {}
  void One(const absl::StatusOr<int32_t>& n) {
    absl::StatusOr<int32_t> result;
    {
      absl::MutexLock lock(&mu_);
      if (n.ok()) {
        total_ += *n;
      } else if (first_error_.ok() && !absl::IsNotFound(n.status())) {
        first_error_ = n.status();  // a member that ended meanwhile is not an error
      }
      if (--pending_ > 0) return;
      // The outcome is read under the lock like every other access, not on the argument that
      // no other member's callback can run after the last one.
      result = first_error_.ok() ? absl::StatusOr<int32_t>(std::max(total_, marked_))
                                 : absl::StatusOr<int32_t>(first_error_);
    }
    Done done = std::move(done_);
    delete this;
    done(std::move(result));
  }

  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_);
  const int marked_;
  int32_t total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  Done done_;
};

}  // namespace

void RouterService::AbortRequests(const rl::v1::AbortRequest& request,
                                  std::optional<std::string> authorization,
                                  std::function<void(absl::StatusOr<int32_t>)> done) {
  if (!request.abort_all() && request.request_id().empty() && !request.group_id().empty()) {
    GroupAbort::Start(this, request.group_id(), std::move(authorization), std::move(done));
    return;
  }
  (new AbortForward(this, request, std::move(authorization), std::move(done)))->Start();
}

grpc::ServerUnaryReactor* RouterService::Abort(grpc::CallbackServerContext* context,
                                               const rl::v1::AbortRequest* request,
                                               rl::v1::AbortResponse* response) {
  const BearerAuth* auth = request->abort_all() ? admin_auth_ : data_auth_;
  if (absl::Status s = auth->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (!request->abort_all() && request->request_id().empty() && request->group_id().empty()) {
    return FinishUnary(context,
                       absl::InvalidArgumentError("request_id: set it, group_id or abort_all"));
  }
  if (!request->group_id().empty() && (request->abort_all() || !request->request_id().empty())) {
    return FinishUnary(context, absl::InvalidArgumentError(
                                    "group_id: set it alone (not with request_id or abort_all)"));
  }
  if (request->group_id().size() > kMaxRoutingKeyBytes) {
    return FinishUnary(context, absl::InvalidArgumentError(
                                    absl::StrCat("group_id: ", request->group_id().size(),
                                                 " bytes is more than ", kMaxRoutingKeyBytes)));
  }
  if (static_cast<int64_t>(request->request_id().size()) > limits_.max_request_id_bytes) {
    return FinishUnary(context, absl::InvalidArgumentError(
                                    absl::StrCat("request_id: ", request->request_id().size(),
                                                 " bytes is more than --max-request-id-bytes (",
                                                 limits_.max_request_id_bytes, ")")));
  }
  if (aborts_in_flight_.fetch_add(1) >= kMaxAbortsInFlight) {
    aborts_in_flight_.fetch_sub(1);
    return FinishUnary(context, absl::ResourceExhaustedError(
                                    absl::StrCat("Router.Abort: ", kMaxAbortsInFlight,
                                                 " aborts are in flight already; retry shortly")));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  AbortRequests(*request, AuthorizationHeader(*context),
                [this, reactor, response](absl::StatusOr<int32_t> n) {
                  if (n.ok()) response->set_num_aborted(*n);
                  // Before Finish: once the call is finished the server (and this service) may
                  // be gone.
                  aborts_in_flight_.fetch_sub(1);
                  reactor->Finish(ToGrpcStatus(n.status()));
                });
  return reactor;
}

}  // namespace rl::router
