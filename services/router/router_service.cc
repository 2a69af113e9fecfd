#include "services/router/router_service.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "services/router/cache/cache_store.h"

namespace rl::router {
namespace {

std::string StripBrackets(std::string host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

// Whether `host` is one of this machine's interface addresses (numeric hosts only: no DNS).
bool IsLocalInterface(const std::string& host) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* a = list; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                sizeof(text));
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, text,
                sizeof(text));
    }
    found = host == text;
  }
  freeifaddrs(list);
  return found;
}

// Whether `address` (HOST:PORT) names this router, listening on `listen_host`:`port`: the same
// port and a host that is this machine without DNS (the listening host, a loopback or wildcard
// name, the hostname, an interface address).
bool NamesThisRouter(const std::string& address, const std::string& listen_host, int port) {
  const size_t colon = address.rfind(':');
  int p = 0;
  if (port <= 0 || colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &p) ||
      p != port) {
    return false;
  }
  const std::string host = StripBrackets(address.substr(0, colon));
  if (host == StripBrackets(listen_host) || host == "localhost" || host == "ip6-localhost" ||
      host == "0.0.0.0" || host == "::" || host == "::1" || absl::StartsWith(host, "127.")) {
    return true;
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0 && host == name) return true;
  return IsLocalInterface(host);
}

}  // namespace

RouterService::RouterService(WorkerPool* pool, TextCache* cache,
                             const tokenizer::Tokenizer* tokenizer, const BearerAuth* data_auth,
                             const BearerAuth* admin_auth, MetricsRegistry* metrics,
                             const RouterServiceOptions& options)
    : pool_(pool),
      cache_(cache),
      tokenizer_(tokenizer),
      data_auth_(data_auth),
      admin_auth_(admin_auth),
      options_(options),
      admission_(options.admission),
      metrics_(metrics, pool, cache, &admission_, &seam_counters_) {
  env_.workers = pool;
  env_.cache = cache;
  env_.tokenizer = tokenizer;
  env_.seam_counters = &seam_counters_;
  env_.requests = &requests_;
  env_.limits = options.limits;
  env_.retry = options.retry;
  env_.retries_total = metrics_.retries_total();
  env_.record_prefix = [this](const std::string& worker, int64_t prompt, int64_t cached) {
    metrics_.RecordPrefix(worker, prompt, cached);
  };
  env_.episodes = options.episodes;
  env_.max_version_lag = options.max_version_lag;
  env_.resume_store = options.resume_store;
  env_.history_unknown_total = metrics_.history_unknown_total();
  generate_.env = &env_;
  generate_.pool = pool;
  generate_.data_auth = data_auth;
  generate_.admission = &admission_;
  generate_.blocking = options.blocking;
  generate_.max_stream_buffer_bytes = options.max_stream_buffer_bytes;
  generate_.metrics = &metrics_;
  generate_.live = &live_;
  generate_.drain = options.drain;
  generate_.refuse_when_store_failed = options.refuse_when_store_failed;
}

RouterService::~RouterService() { WaitForGenerations(); }

absl::Status RouterService::CheckNotDraining(absl::string_view what) const {
  return options_.drain != nullptr ? options_.drain->Check(what) : absl::OkStatus();
}

grpc::ServerWriteReactor<rl::v1::GenerateResponse>* RouterService::Generate(
    grpc::CallbackServerContext* context, const rl::v1::GenerateRequest* request) {
  return StartGenerate(&generate_, context, *request);
}

grpc::ServerUnaryReactor* RouterService::RetrieveFromText(
    grpc::CallbackServerContext* context, const rl::v1::RetrieveFromTextRequest* request,
    rl::v1::RetrieveFromTextResponse* response) {
  if (absl::Status s = data_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (request->text().empty())
    return FinishUnary(context, absl::InvalidArgumentError("text: must not be empty"));
  if (static_cast<int64_t>(request->text().size()) > limits_.max_prompt_bytes) {
    return FinishUnary(
        context, absl::InvalidArgumentError(absl::StrCat("text: ", request->text().size(),
                                                         " bytes is more than --max-prompt-bytes (",
                                                         limits_.max_prompt_bytes, ")")));
  }
  if (request->tokenize_remainder()) {
    if (tokenizer_ == nullptr)
      return FinishUnary(context, absl::FailedPreconditionError("no tokenizer"));
    if (request->text().size() <= kInlinePromptBytes) {
      return FinishUnary(context, ResolveForRetrieve(request->text(), response));
    }
    // A long text's tokenization runs on the blocking pool, off the callback thread.
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (!options_.blocking->Submit([this, reactor, request, response] {
          reactor->Finish(ToGrpcStatus(ResolveForRetrieve(request->text(), response)));
        })) {
      reactor->Finish(ToGrpcStatus(options_.blocking->BusyError()));
    }
    return reactor;
  }
  rl::v1::Trajectory* t = response->mutable_trajectory();
  CacheRetrieval r = cache_->Retrieve(request->text());
  t->mutable_tokens()->Assign(r.tokens.begin(), r.tokens.end());
  for (uint8_t m : r.loss_mask) t->add_loss_mask(m);
  t->mutable_rollout_logp()->Assign(r.rollout_logp.begin(), r.rollout_logp.end());
  t->mutable_token_weight_versions()->Assign(r.token_versions.begin(), r.token_versions.end());
  t->set_weight_version(r.weight_version);
  response->set_matched_bytes(static_cast<int64_t>(r.matched_bytes));
  response->set_cached_tokens(static_cast<int32_t>(r.tokens.size()));
  MarkHistory(response);
  return FinishUnary(context, absl::OkStatus());
}

void RouterService::MarkHistory(rl::v1::RetrieveFromTextResponse* response) {
  const CacheStore* store = cache_->store();
  if (store != nullptr && !store->GetStats().failed) return;
  response->set_cache_history_unknown(true);
  metrics_.history_unknown_total()->Inc();
}

absl::Status RouterService::ResolveForRetrieve(const std::string& text,
                                               rl::v1::RetrieveFromTextResponse* response) {
  // The tokens a Generate of this text would send: one cache lookup, one hit or miss.
  ASSIGN_OR_RETURN(ResolvedPrompt r,
                   ResolveTextPrompt(text, *cache_, *tokenizer_, &seam_counters_));
  const int64_t current = cache_->GetStats().current_version;
  std::vector<int64_t> versions = r.versions;
  versions.resize(r.ids.size(), current);
  rl::v1::Trajectory* t = response->mutable_trajectory();
  t->mutable_tokens()->Assign(r.ids.begin(), r.ids.end());
  for (uint8_t m : r.mask) t->add_loss_mask(m);
  t->mutable_rollout_logp()->Assign(r.logprobs.begin(), r.logprobs.end());
  t->mutable_token_weight_versions()->Assign(versions.begin(), versions.end());
  int64_t newest = 0;
  for (int64_t v : versions) newest = std::max(newest, v);
  t->set_weight_version(newest);
  response->set_matched_bytes(r.cached_tokens > 0 ? r.ends[r.cached_tokens - 1] : 0);
  response->set_cached_tokens(r.cached_tokens);
  MarkHistory(response);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* RouterService::AddWorker(grpc::CallbackServerContext* context,
                                                   const rl::v1::AddWorkerRequest* request,
                                                   rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckNotDraining("AddWorker"); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckAddress(request->address(), limits_); !s.ok()) {
    return FinishUnary(context, s);
  }
  {
    absl::MutexLock lock(&own_mu_);
    if (NamesThisRouter(request->address(), own_host_, own_port_)) {
      return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat(
                                      "address: '", request->address(),
                                      "' is this router's own address, not an rl-worker")));
    }
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Add checks the worker once (a network round trip, bounded by --health-timeout-ms): off the
  // callback thread.
  if (!options_.admin->Submit([this, reactor, address = request->address(),
                               allow_unreachable = request->allow_unreachable(), response] {
        absl::Status s = pool_->AddChecked(address, allow_unreachable);
        // Durable before the answer: a restart registers it again (fleet_record.h).
        if (s.ok() && options_.fleet_record != nullptr) {
          s = options_.fleet_record->RecordAdded(address);
        }
        if (s.ok()) pool_->FillList(response);
        reactor->Finish(ToGrpcStatus(s));
      })) {
    reactor->Finish(ToGrpcStatus(options_.admin->BusyError()));
  }
  return reactor;
}

void RouterService::SetOwnAddress(const std::string& host, int port) {
  absl::MutexLock lock(&own_mu_);
  own_host_ = host;
  own_port_ = port;
}

grpc::ServerUnaryReactor* RouterService::RemoveWorker(grpc::CallbackServerContext* context,
                                                      const rl::v1::RemoveWorkerRequest* request,
                                                      rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckNotDraining("RemoveWorker"); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckAddress(request->address(), limits_); !s.ok()) {
    return FinishUnary(context, s);
  }
  absl::Status s = pool_->Remove(request->address());
  if (s.ok()) metrics_.ForgetWorker(request->address());
  if (s.ok() && options_.fleet_record != nullptr) {
    // Durable before the answer (one small transaction): a restart does not bring it back,
    // even when it is a --worker flag.
    s = options_.fleet_record->RecordRemoved(request->address());
  }
  if (s.ok()) pool_->FillList(response);
  return FinishUnary(context, s);
}

grpc::ServerUnaryReactor* RouterService::AdoptWorkerVersion(
    grpc::CallbackServerContext* context, const rl::v1::AdoptWorkerVersionRequest* request,
    rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckNotDraining("AdoptWorkerVersion"); !s.ok()) {
    return FinishUnary(context, s);
  }
  if (absl::Status s = CheckAddress(request->address(), limits_); !s.ok()) {
    return FinishUnary(context, s);
  }
  if (request->model_path().size() > 4096) {
    return FinishUnary(context, absl::InvalidArgumentError("model_path: longer than 4096 bytes"));
  }
  if (request->model_path().find_first_of("\n\r") != std::string::npos) {
    return FinishUnary(context, absl::InvalidArgumentError("model_path: contains a line break"));
  }
  // Records the fleet's new version (persisted by the fleet record, an observer of the pool,
  // before this returns) and hands the workers now behind to catch-up: a blocking store write,
  // off the callback thread, under the admin lock (never between a weight update's broadcast and
  // its record, nor during a catch-up).
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!options_.admin->Submit(
          [this, reactor, address = request->address(), path = request->model_path(), response] {
            if (admin_lock_ != nullptr) {
              if (absl::Status s = admin_lock_->Acquire("AdoptWorkerVersion"); !s.ok()) {
                reactor->Finish(ToGrpcStatus(s));
                return;
              }
            }
            absl::StatusOr<FleetWeights> fleet = pool_->AdoptWorkerVersion(address, path);
            if (admin_lock_ != nullptr) admin_lock_->Release();
            if (fleet.ok()) pool_->FillList(response);
            reactor->Finish(ToGrpcStatus(fleet.status()));
          })) {
    reactor->Finish(ToGrpcStatus(options_.admin->BusyError()));
  }
  return reactor;
}

grpc::ServerUnaryReactor* RouterService::ListWorkers(grpc::CallbackServerContext* context,
                                                     const rl::v1::ListWorkersRequest*,
                                                     rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  pool_->FillList(response);
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* RouterService::SetWorkerEnabled(
    grpc::CallbackServerContext* context, const rl::v1::SetWorkerEnabledRequest* request,
    rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckNotDraining("SetWorkerEnabled"); !s.ok())
    return FinishUnary(context, s);
  if (absl::Status s = CheckAddress(request->address(), limits_); !s.ok()) {
    return FinishUnary(context, s);
  }
  absl::Status s = pool_->SetEnabled(request->address(), request->enabled());
  if (s.ok()) pool_->FillList(response);
  return FinishUnary(context, s);
}

grpc::ServerUnaryReactor* RouterService::GetMetrics(grpc::CallbackServerContext* context,
                                                    const rl::v1::GetMetricsRequest*,
                                                    rl::v1::GetMetricsResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  metrics_.Fill(response);
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* RouterService::GetEpisode(grpc::CallbackServerContext* context,
                                                    const rl::v1::GetEpisodeRequest* request,
                                                    rl::v1::GetEpisodeResponse* response) {
  if (absl::Status s = data_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (options_.episodes == nullptr) {
    return FinishUnary(context, absl::FailedPreconditionError("this router records no episodes"));
  }
  absl::StatusOr<rl::v1::GetEpisodeResponse> r = options_.episodes->Export(
      request->episode_id(), EpisodeExportOptions{
                                 .remove = request->remove(),
                                 .routed_experts = request->return_routed_experts(),
                                 .expert_weights = request->return_expert_weights(),
                             });
  if (r.ok()) *response = *std::move(r);
  return FinishUnary(context, r.status());
}

}  // namespace rl::router
