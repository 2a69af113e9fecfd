#include "services/admin/admin_fanout.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace rl::admin {
namespace {

using Ctx = grpc::CallbackServerContext;

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// Runs fn(worker, index) for every worker in parallel and returns the results in order.
template <typename T>
std::vector<T> ForEachParallel(const std::vector<std::shared_ptr<router::Worker>>& workers,
                               const std::function<T(router::Worker&, size_t)>& fn) {
  std::vector<T> out(workers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = fn(*workers[i], i); });
  }
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace

template <typename Req, typename Resp>
std::vector<Reply<Resp>> AdminFanout::Gather(Ctx* caller, const Req& req,
                                             StubMethod<Req, Resp> method) const {
  const auto targets = pool_->LiveWorkers();
  return ForEachParallel<Reply<Resp>>(targets, [&](router::Worker& w, size_t) {
    Reply<Resp> r;
    r.worker = w.address();
    grpc::ClientContext ctx;
    Prepare(caller, &ctx);
    r.status = (w.admin_stub().*method)(&ctx, req, &r.resp);
    return r;
  });
}

void AdminFanout::Prepare(Ctx* caller, grpc::ClientContext* ctx) const {
  ctx->set_deadline(std::chrono::system_clock::now() + options_.call_timeout);
  if (auto header = AuthorizationHeader(*caller)) ctx->AddMetadata("authorization", *header);
}

grpc::ServerUnaryReactor* AdminFanout::Run(Ctx* c, std::function<absl::Status()> fn) {
  if (absl::Status s = auth_->Check(*c); !s.ok()) return FinishUnary(c, s);
  grpc::ServerUnaryReactor* reactor = c->DefaultReactor();
  std::thread([reactor, fn = std::move(fn)] { reactor->Finish(ToGrpcStatus(fn())); }).detach();
  return reactor;
}

absl::Status AdminFanout::Broadcast(const char* what, Ctx* caller, Routing routing,
                                    bool bumps_version, const WorkerCall& call,
                                    rl::v1::AdminResponse* resp) {
  {
    absl::MutexLock lock(&admin_mu_);
    auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(admin_mu_) { return !admin_busy_; };
    if (!admin_mu_.AwaitWithTimeout(absl::Condition(&free),
                                    absl::FromChrono(options_.lock_timeout))) {
      return absl::UnavailableError(
          absl::StrCat(what, ": another admin operation holds the admin lock (waited ",
                       options_.lock_timeout.count(), " ms); try again later"));
    }
    admin_busy_ = true;
  }
  const std::vector<std::shared_ptr<router::Worker>> targets = pool_->LiveWorkers();
  std::vector<bool> was_enabled;
  for (const auto& w : targets) was_enabled.push_back(pool_->IsEnabled(w->address()));
  const bool disable = routing != Routing::kKeep;
  if (disable) {
    pool_->BeginHold();
    for (const auto& w : targets) (void)pool_->SetEnabled(w->address(), false);
  }
  struct Result {
    grpc::Status status;
    rl::v1::AdminResponse resp;
  };
  std::vector<Result> results = ForEachParallel<Result>(targets, [&](router::Worker& w, size_t i) {
    Result r;
    grpc::ClientContext ctx;
    Prepare(caller, &ctx);
    r.status = call(w, i, ctx, &r.resp);
    return r;
  });
  bool all_ok = !targets.empty();
  int64_t version = -1;
  for (size_t i = 0; i < targets.size(); ++i) {
    router::Worker& w = *targets[i];
    const Result& r = results[i];
    rl::v1::WorkerResult* out = resp->add_results();
    out->set_worker(w.address());
    out->set_success(r.status.ok());
    out->set_code(CodeName(r.status.error_code()));
    out->set_message(r.status.ok() ? r.resp.message() : r.status.error_message());
    out->set_weight_version(r.resp.weight_version());
    resp->set_num_aborted(resp->num_aborted() + r.resp.num_aborted());
    if (r.status.ok()) {
      pool_->ReportVersion(&w, r.resp.weight_version());
      version = std::max(version, r.resp.weight_version());
      if (disable) {
        // It answered: whatever a health check saw mid-call (NOT_SERVING while an update held
        // the engine) is over; a worker put to sleep is not serving. Set before re-enabling, so
        // no request is routed on a stale flag.
        pool_->SetServing(w.address(), routing != Routing::kSleep);
        (void)pool_->SetEnabled(w.address(), was_enabled[i]);
      }
    } else {
      all_ok = false;
      if (r.status.error_code() == grpc::StatusCode::UNAVAILABLE) pool_->ReportFailure(&w);
      spdlog::warn("{} failed on {}: {}{}", what, w.address(), r.status.error_message(),
                   disable ? " (left disabled)" : "");
    }
  }
  if (disable) pool_->EndHold();
  if (bumps_version && version >= 0) cache_->SetCurrentVersion(version);
  {
    absl::MutexLock lock(&admin_mu_);
    admin_busy_ = false;
  }
  resp->set_success(all_ok);
  resp->set_weight_version(version);
  resp->set_message(targets.empty()
                        ? "no live worker"
                        : absl::StrCat(what, ": ", all_ok ? "ok on all " : "failed on some of ",
                                       targets.size(), " workers"));
  if (targets.empty()) return absl::UnavailableError(absl::StrCat(what, ": no live worker"));
  return absl::OkStatus();
}

#define RL_FANOUT_UNARY(Method, Request, routing, bumps)                                         \
  grpc::ServerUnaryReactor* AdminFanout::Method(Ctx* c, const rl::v1::Request* req,              \
                                                rl::v1::AdminResponse* resp) {                   \
    return Run(c, [this, c, req, resp] {                                                         \
      return Broadcast(                                                                          \
          #Method, c, routing, bumps,                                                            \
          [req](router::Worker& w, size_t, grpc::ClientContext& ctx, rl::v1::AdminResponse* r) { \
            return w.admin_stub().Method(&ctx, *req, r);                                         \
          },                                                                                     \
          resp);                                                                                 \
    });                                                                                          \
  }

RL_FANOUT_UNARY(PauseGeneration, PauseGenerationRequest, Routing::kDisableDuring, false)
RL_FANOUT_UNARY(ContinueGeneration, ContinueGenerationRequest, Routing::kKeep, false)
RL_FANOUT_UNARY(FlushCache, FlushCacheRequest, Routing::kKeep, false)
RL_FANOUT_UNARY(UpdateWeightsFromDisk, UpdateWeightsFromDiskRequest, Routing::kDisableDuring, true)
RL_FANOUT_UNARY(UpdateWeightsFromDistributed, UpdateWeightsFromDistributedRequest,
                Routing::kDisableDuring, true)
RL_FANOUT_UNARY(DestroyWeightsUpdateGroup, DestroyWeightsUpdateGroupRequest, Routing::kKeep, false)

#undef RL_FANOUT_UNARY

// Each worker joins as its own rank: the i-th live worker (by address) gets rank_offset + i.
grpc::ServerUnaryReactor* AdminFanout::InitWeightsUpdateGroup(
    Ctx* c, const rl::v1::InitWeightsUpdateGroupRequest* req, rl::v1::AdminResponse* resp) {
  return Run(c, [this, c, req, resp] {
    return Broadcast(
        "InitWeightsUpdateGroup", c, Routing::kDisableDuring, false,
        [req](router::Worker& w, size_t i, grpc::ClientContext& ctx, rl::v1::AdminResponse* r) {
          rl::v1::InitWeightsUpdateGroupRequest mine = *req;
          mine.set_rank_offset(req->rank_offset() + static_cast<int32_t>(i));
          return w.admin_stub().InitWeightsUpdateGroup(&ctx, mine, r);
        },
        resp);
  });
}

grpc::ServerUnaryReactor* AdminFanout::ReleaseMemory(Ctx* c,
                                                     const rl::v1::ReleaseMemoryRequest* req,
                                                     rl::v1::AdminResponse* resp) {
  return Run(c, [this, c, req, resp] {
    return SleepOrWake(
        c, /*sleep=*/true, resp,
        [req](router::Worker& w, size_t, grpc::ClientContext& ctx, rl::v1::AdminResponse* r) {
          return w.admin_stub().ReleaseMemory(&ctx, *req, r);
        });
  });
}

grpc::ServerUnaryReactor* AdminFanout::ResumeMemory(Ctx* c, const rl::v1::ResumeMemoryRequest* req,
                                                    rl::v1::AdminResponse* resp) {
  return Run(c, [this, c, req, resp] {
    return SleepOrWake(
        c, /*sleep=*/false, resp,
        [req](router::Worker& w, size_t, grpc::ClientContext& ctx, rl::v1::AdminResponse* r) {
          return w.admin_stub().ResumeMemory(&ctx, *req, r);
        });
  });
}

absl::Status AdminFanout::SleepOrWake(Ctx* c, bool sleep, rl::v1::AdminResponse* resp,
                                      const WorkerCall& call) {
  RETURN_IF_ERROR(Broadcast(sleep ? "ReleaseMemory" : "ResumeMemory", c,
                            sleep ? Routing::kSleep : Routing::kKeep, false, call, resp));
  // Route to woken workers at once instead of waiting for the next health check (sleeping ones
  // were marked by the broadcast).
  if (!sleep) {
    for (const auto& r : resp->results()) {
      if (r.success()) pool_->SetServing(r.worker(), true);
    }
  }
  return absl::OkStatus();
}

namespace {

// Buffers a client stream of tensor chunks, then replays it to every worker.
class TensorFanoutReactor final
    : public grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest> {
 public:
  using Apply =
      std::function<absl::Status(const std::vector<rl::v1::UpdateWeightsFromTensorRequest>&)>;
  explicit TensorFanoutReactor(Apply apply) : apply_(std::move(apply)) { StartRead(&msg_); }

  void OnReadDone(bool ok) override {
    if (ok) {
      messages_.push_back(std::move(msg_));
      StartRead(&msg_);
      return;
    }
    std::thread([this] { Finish(ToGrpcStatus(apply_(messages_))); }).detach();
  }
  void OnDone() override { delete this; }

 private:
  Apply apply_;
  rl::v1::UpdateWeightsFromTensorRequest msg_;
  std::vector<rl::v1::UpdateWeightsFromTensorRequest> messages_;
};

class RejectReactor final : public grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest> {
 public:
  explicit RejectReactor(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest>*
AdminFanout::UpdateWeightsFromTensor(Ctx* c, rl::v1::AdminResponse* resp) {
  if (absl::Status s = auth_->Check(*c); !s.ok()) return new RejectReactor(s);
  return new TensorFanoutReactor(
      [this, c, resp](const std::vector<rl::v1::UpdateWeightsFromTensorRequest>& messages) {
        return Broadcast(
            "UpdateWeightsFromTensor", c, Routing::kDisableDuring, true,
            [&messages](router::Worker& w, size_t, grpc::ClientContext& ctx,
                        rl::v1::AdminResponse* r) {
              auto writer = w.admin_stub().UpdateWeightsFromTensor(&ctx, r);
              for (const auto& m : messages) {
                if (!writer->Write(m)) break;
              }
              writer->WritesDone();
              return writer->Finish();
            },
            resp);
      });
}

grpc::ServerUnaryReactor* AdminFanout::GetModelInfo(Ctx* c, const rl::v1::GetModelInfoRequest* req,
                                                    rl::v1::GetModelInfoResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    const auto replies = Gather(c, *req, &rl::v1::Admin::Stub::GetModelInfo);
    if (replies.empty()) return absl::UnavailableError("GetModelInfo: no live worker");
    bool have = false;
    for (const auto& r : replies) {
      if (!r.status.ok()) continue;
      if (!have) {
        *resp = r.resp;
        have = true;
      }
      rl::v1::WorkerModelInfo* w = resp->add_workers();
      w->set_worker(r.worker);
      *w->mutable_info() = r.resp;
    }
    if (!have) return FromGrpcStatus(replies[0].status);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminFanout::GetServerInfo(Ctx* c,
                                                     const rl::v1::GetServerInfoRequest* req,
                                                     rl::v1::GetServerInfoResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    // Totals over the workers; paused when any worker is.
    for (const auto& r : Gather(c, *req, &rl::v1::Admin::Stub::GetServerInfo)) {
      if (!r.status.ok()) continue;
      const auto& info = r.resp;
      resp->set_paused(resp->paused() || info.paused());
      resp->set_num_running(resp->num_running() + info.num_running());
      resp->set_num_waiting(resp->num_waiting() + info.num_waiting());
      resp->set_kv_tokens_total(resp->kv_tokens_total() + info.kv_tokens_total());
      resp->set_kv_tokens_available(resp->kv_tokens_available() + info.kv_tokens_available());
      resp->set_num_finished(resp->num_finished() + info.num_finished());
      resp->set_update_failed(resp->update_failed() || info.update_failed());
      resp->set_weight_version(std::max(resp->weight_version(), info.weight_version()));
      rl::v1::WorkerServerInfo* w = resp->add_workers();
      w->set_worker(r.worker);
      *w->mutable_info() = info;
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminFanout::ListWeights(Ctx* c, const rl::v1::ListWeightsRequest* req,
                                                   rl::v1::ListWeightsResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    auto targets = pool_->LiveWorkers();
    if (targets.empty()) return absl::UnavailableError("ListWeights: no live worker");
    grpc::ClientContext ctx;
    Prepare(c, &ctx);
    return FromGrpcStatus(targets.front()->admin_stub().ListWeights(&ctx, *req, resp));
  });
}

grpc::ServerUnaryReactor* AdminFanout::WeightsChecker(Ctx* c,
                                                      const rl::v1::WeightsCheckerRequest* req,
                                                      rl::v1::WeightsCheckerResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    const auto replies = Gather(c, *req, &rl::v1::Admin::Stub::WeightsChecker);
    if (replies.empty()) return absl::UnavailableError("WeightsChecker: no live worker");
    bool all_ok = true;
    for (const auto& r : replies) {
      rl::v1::WorkerWeightsChecker* w = resp->add_workers();
      w->set_worker(r.worker);
      if (r.status.ok()) {
        *w->mutable_result() = r.resp;
        all_ok = all_ok && r.resp.success();
      } else {
        w->mutable_result()->set_success(false);
        w->mutable_result()->set_message(r.status.error_message());
        all_ok = false;
      }
    }
    resp->set_success(all_ok);
    resp->set_message(absl::StrCat(replies.size(), " workers"));
    return absl::OkStatus();
  });
}

}  // namespace rl::admin
