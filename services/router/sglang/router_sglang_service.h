// sglang.grpc.scheduler.SglangScheduler on rl-router: SGLang's gRPC scheduler protocol, so the
// Shepherd Model Gateway (SMG, with its chat templates, tool-call and reasoning parsers and its
// OpenAI and Anthropic HTTP APIs) fronts the router, and an unmodified agent reaches the text
// cache, the admin broadcast and the versions through it. docs/episodes.md has the path.
//
// Generate is a translator in front of the router's own Router.Generate, called over the gRPC
// server's in-process channel (so admission, retries, the text cache and episodes are exactly
// the trainers'): the gateway's token ids are decoded to the text they render (a leading
// template prefix, e.g. BOS, left to the router, which adds it to every text), the text goes
// through the cache (earlier turns' generated tokens reused exactly, the rest encoded as the
// whole text would be), the sampling fields are read as rl-worker reads them
// (common/sglang/sglang_request.h), and the request id's `episode=ID` token names the episode.
// The router's chunks and finals go back as SGLang chunks and completes (usage counts are the
// router's prompt). GetModelInfo, GetServerInfo and GetLoads are answered by a live worker's
// own SglangScheduler (the tokenizer path is the router's); HealthCheck is the SGLang side's
// readiness (sglang_readiness.h: not draining, a routable worker); GetTokenizer streams the
// router's --tokenizer folder; Abort reaches Router.Abort. Input logprobs, embeddings, LoRA,
// profiling and KV events are not served (INVALID_ARGUMENT or UNIMPLEMENTED with a message).
//
// Auth: `auth` guards every call (the router's data key on its main port; none on
// --sglang-port, which is where the gateway belongs when the router has a key, as SMG 1.13
// sends none). Cost per turn: one decode of the prompt ids, one in-process call, one message
// translation per chunk. Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "common/auth.h"
#include "common/drain_gate.h"
#include "common/sglang/tokenizer_bundle.h"
#include "common/tokenizer/tokenizer.h"
#include "grpcpp/channel.h"
#include "rl/v1/router.grpc.pb.h"
#include "services/router/pool/worker_pool.h"
#include "services/router/router_service.h"
#include "sglang_scheduler.grpc.pb.h"

namespace rl::router {

namespace sgl = ::sglang::grpc::scheduler;

// The client id (rl-client-id) the gateway's requests are admitted under when they name no
// episode (an episode's turns are admitted under its id).
inline constexpr char kSglangClientId[] = "sglang-gateway";

// The Router.Generate request for the gateway's `in`: InvalidArgument naming the field the
// router does not serve or the bad value.
absl::StatusOr<rl::v1::GenerateRequest> SglangToRouterRequest(const sgl::GenerateRequest& in,
                                                              const tokenizer::Tokenizer& tokenizer,
                                                              int32_t max_n);

class RouterSglangService final : public sgl::SglangScheduler::CallbackService {
 public:
  // `authorization` is the header the calls to the router's own Router service carry (the
  // router's data key, when it has one); `tokenizer_dir` the --tokenizer folder. Everything
  // referenced must outlive the service; `drain` (null: never draining) is the router's.
  RouterSglangService(WorkerPool* pool, RouterService* router_service,
                      const tokenizer::Tokenizer* tokenizer, std::string tokenizer_dir,
                      std::optional<std::string> authorization, const BearerAuth* auth,
                      int32_t max_n, const DrainGate* drain = nullptr);
  // The in-process channel to the Router service (once the server that holds it has started);
  // Generate is UNAVAILABLE before. Call once.
  void Connect(std::shared_ptr<grpc::Channel> router);

  grpc::ServerWriteReactor<sgl::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const sgl::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* HealthCheck(grpc::CallbackServerContext* context,
                                        const sgl::HealthCheckRequest* request,
                                        sgl::HealthCheckResponse* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const sgl::AbortRequest* request,
                                  sgl::AbortResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const sgl::GetModelInfoRequest* request,
                                         sgl::GetModelInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const sgl::GetServerInfoRequest* request,
                                          sgl::GetServerInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetLoads(grpc::CallbackServerContext* context,
                                     const sgl::GetLoadsRequest* request,
                                     sgl::GetLoadsResponse* response) override;
  grpc::ServerWriteReactor<::smg::grpc::common::GetTokenizerChunk>* GetTokenizer(
      grpc::CallbackServerContext* context,
      const ::smg::grpc::common::GetTokenizerRequest* request) override;

 private:
  // A live worker (null when none is).
  std::shared_ptr<Worker> AnyLiveWorker() const;

  WorkerPool* const pool_;
  RouterService* const router_service_;
  const tokenizer::Tokenizer* const tokenizer_;
  const std::string tokenizer_dir_;
  std::unique_ptr<rl::v1::Router::Stub> router_owner_;
  std::atomic<rl::v1::Router::Stub*> router_{nullptr};
  const std::optional<std::string> authorization_;
  const BearerAuth* const auth_;
  const int32_t max_n_;
  const DrainGate* const drain_;
  sglang::TokenizerBundle tokenizer_bundle_;
};

}  // namespace rl::router
