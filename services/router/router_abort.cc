// Router.Abort: one in-flight request by id, forwarded to the worker that holds it, or every
// request on every live worker (abort_all, admin key). Kept apart from router_service.cc.
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "services/router/router_service.h"
#include "spdlog/spdlog.h"

namespace rl::router {
namespace {

// How long a forwarded abort that found nothing on the worker is repeated: the worker may not
// have registered the request yet when the abort overtakes it.
constexpr int kForwardTries = 40;
constexpr std::chrono::milliseconds kForwardPause{50};
constexpr std::chrono::seconds kForwardDeadline{10};
// Router.Abort forwards on the admin executor: at most this many at once, the rest are refused
// (RESOURCE_EXHAUSTED) so a burst of aborts cannot crowd out the admin calls queued there.
constexpr int kMaxAbortsInFlight = 64;

absl::StatusOr<int32_t> ForwardAbort(Worker& worker, const rl::v1::AbortRequest& request,
                                     const std::optional<std::string>& authorization) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kForwardDeadline);
  if (authorization) ctx.AddMetadata("authorization", *authorization);
  rl::v1::AbortResponse response;
  RETURN_IF_ERROR(FromGrpcStatus(worker.worker_stub().Abort(&ctx, request, &response)));
  return response.num_aborted();
}

}  // namespace

absl::StatusOr<int32_t> RouterService::AbortRequests(
    const rl::v1::AbortRequest& request, const std::optional<std::string>& authorization) {
  if (request.abort_all()) {
    requests_.MarkAllAborted();
    int32_t total = 0;
    rl::v1::AbortRequest all;
    all.set_abort_all(true);
    // Every live worker gets it, also past one that fails; the first failure is returned.
    absl::Status first_error;
    for (const std::shared_ptr<Worker>& w : pool_->LiveWorkers()) {
      absl::StatusOr<int32_t> n = ForwardAbort(*w, all, authorization);
      if (n.ok()) {
        total += *n;
      } else if (first_error.ok()) {
        first_error = Annotate(n.status(), absl::StrCat("worker ", w->address()));
      }
    }
    RETURN_IF_ERROR(first_error);
    return total;
  }
  const std::string& id = request.request_id();
  for (int attempt = 0; attempt < kForwardTries; ++attempt) {
    ASSIGN_OR_RETURN(std::string address, requests_.MarkAborted(id));
    // Between two attempts: the mark alone stops the request.
    if (address.empty()) return 0;
    std::shared_ptr<Worker> worker = pool_->Find(address);
    if (worker == nullptr) return 0;
    rl::v1::AbortRequest one;
    one.set_request_id(id);
    absl::StatusOr<int32_t> n = ForwardAbort(*worker, one, authorization);
    if (!n.ok()) return Annotate(n.status(), absl::StrCat("worker ", address));
    if (*n > 0) return *n;
    std::this_thread::sleep_for(kForwardPause);
  }
  spdlog::warn("Router.Abort: worker never reported request '{}' aborted", id);
  return 0;
}

grpc::ServerUnaryReactor* RouterService::Abort(grpc::CallbackServerContext* context,
                                               const rl::v1::AbortRequest* request,
                                               rl::v1::AbortResponse* response) {
  const BearerAuth* auth = request->abort_all() ? admin_auth_ : data_auth_;
  if (absl::Status s = auth->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (!request->abort_all() && request->request_id().empty()) {
    return FinishUnary(context, absl::InvalidArgumentError("request_id: set it or abort_all"));
  }
  if (static_cast<int64_t>(request->request_id().size()) > limits_.max_request_id_bytes) {
    return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat(
                                    "request_id: ", request->request_id().size(),
                                    " bytes is more than --max-request-id-bytes (",
                                    limits_.max_request_id_bytes, ")")));
  }
  if (aborts_in_flight_.fetch_add(1) >= kMaxAbortsInFlight) {
    aborts_in_flight_.fetch_sub(1);
    return FinishUnary(context, absl::ResourceExhaustedError(absl::StrCat(
                                    "Router.Abort: ", kMaxAbortsInFlight,
                                    " aborts are in flight already; retry shortly")));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Forwarding is a network round trip per worker: off the callback thread.
  if (!options_.admin->Submit([this, reactor, req = *request, response,
                               authorization = AuthorizationHeader(*context)] {
        absl::StatusOr<int32_t> n = AbortRequests(req, authorization);
        if (n.ok()) response->set_num_aborted(*n);
        // Before Finish: once the call is finished the server (and this service) may be gone.
        aborts_in_flight_.fetch_sub(1);
        reactor->Finish(ToGrpcStatus(n.status()));
      })) {
    aborts_in_flight_.fetch_sub(1);
    reactor->Finish(ToGrpcStatus(options_.admin->BusyError()));
  }
  return reactor;
}

}  // namespace rl::router
