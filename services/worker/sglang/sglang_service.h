// sglang.grpc.scheduler.SglangScheduler on the worker: SGLang's gRPC scheduler protocol, as the
// Shepherd Model Gateway (SMG) drives an engine, served on the worker's port next to
// rl.v1.Worker. Translates protos ⇄ the engine's domain structs (sglang_convert.h) and calls
// the data plane (GenerateHost) and the control plane (WorkerControl); the engine knows nothing
// of this protocol.
//
// Generate streams `chunk`s (incremental tokens and logprobs, cumulative counts, `index` for
// n > 1) then one `complete` per completion; a non-streaming call gets one `complete` per
// completion. A cancelled call aborts its engine request, as does Abort{request_id}; a
// completion the engine aborts ends the call with UNAVAILABLE, which the gateway retries.
// FlushCache{timeout_s} retries the flush until the engine is idle, for up to timeout_s, on the
// admin executor (flush_waiter.h; at most 64 calls wait); a flush refused because requests are
// in flight answers success=false with the reason. SubscribeKvEvents streams the prefix cache's
// block stores, removals and clears (kv_events_reactor.h). What the engine has no counterpart
// for (embeddings, LoRA, profiling) is UNIMPLEMENTED with a message.
// A request that waits on a paused worker ends UNAVAILABLE after --sglang-pause-timeout-s
// (pause_guard.h), and one sent to a worker paused longer is refused with it: none hangs.
// Auth: the data-plane key (--api-key) guards every call but FlushCache, which takes the admin
// key (--admin-api-key), as rl.v1 does. SMG 1.13 sends no key on gRPC: a call refused for a
// missing key logs (at most once a minute) that the gateway belongs on --sglang-port, where
// WorkerServer serves a second instance of this service with empty keys.
// Thread-safe: gRPC handlers call in concurrently.
#pragma once

#include <atomic>
#include <chrono>

#include "absl/status/status.h"
#include "common/auth.h"
#include "common/bounded_executor.h"
#include "common/sglang/tokenizer_bundle.h"
#include "services/worker/control/worker_control.h"
#include "services/worker/generate_host.h"
#include "services/worker/sglang/flush_waiter.h"
#include "services/worker/sglang/pause_guard.h"
#include "services/worker/worker_config.h"
#include "sglang_scheduler.grpc.pb.h"

namespace rl::worker {

class SglangService final : public ::sglang::grpc::scheduler::SglangScheduler::CallbackService {
 public:
  // Longest FlushCache wait accepted.
  static constexpr float kMaxFlushTimeoutS = 3600;

  // Everything referenced must outlive the service; `executor` runs the FlushCache retries and
  // must be destroyed before the service (the composition root's order).
  SglangService(GenerateHost& host, WorkerControl& control, const WorkerConfig& config,
                BoundedExecutor& executor, PauseGuard& pause_guard, const BearerAuth& data_auth,
                const BearerAuth& admin_auth);
  // Ends pending FlushCache waits (they answer "worker shutting down") and KV event
  // subscriptions (UNAVAILABLE). Call before the gRPC server drains. Idempotent.
  void Shutdown();

  using GenerateRequest = ::sglang::grpc::scheduler::GenerateRequest;
  using GenerateResponse = ::sglang::grpc::scheduler::GenerateResponse;

  grpc::ServerWriteReactor<GenerateResponse>* Generate(grpc::CallbackServerContext* context,
                                                       const GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Embed(grpc::CallbackServerContext* context,
                                  const ::sglang::grpc::scheduler::EmbedRequest* request,
                                  ::sglang::grpc::scheduler::EmbedResponse* response) override;
  grpc::ServerUnaryReactor* HealthCheck(
      grpc::CallbackServerContext* context,
      const ::sglang::grpc::scheduler::HealthCheckRequest* request,
      ::sglang::grpc::scheduler::HealthCheckResponse* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const ::sglang::grpc::scheduler::AbortRequest* request,
                                  ::sglang::grpc::scheduler::AbortResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(
      grpc::CallbackServerContext* context,
      const ::sglang::grpc::scheduler::GetModelInfoRequest* request,
      ::sglang::grpc::scheduler::GetModelInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(
      grpc::CallbackServerContext* context,
      const ::sglang::grpc::scheduler::GetServerInfoRequest* request,
      ::sglang::grpc::scheduler::GetServerInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetLoads(
      grpc::CallbackServerContext* context,
      const ::sglang::grpc::scheduler::GetLoadsRequest* request,
      ::sglang::grpc::scheduler::GetLoadsResponse* response) override;
  grpc::ServerUnaryReactor* FlushCache(grpc::CallbackServerContext* context,
                                       const ::smg::grpc::common::FlushCacheRequest* request,
                                       ::smg::grpc::common::FlushCacheResponse* response) override;
  grpc::ServerUnaryReactor* StartProfile(grpc::CallbackServerContext* context,
                                         const ::smg::grpc::common::StartProfileRequest* request,
                                         ::smg::grpc::common::ProfileResponse* response) override;
  grpc::ServerUnaryReactor* StopProfile(grpc::CallbackServerContext* context,
                                        const ::smg::grpc::common::StopProfileRequest* request,
                                        ::smg::grpc::common::ProfileResponse* response) override;
  grpc::ServerWriteReactor<::smg::grpc::common::GetTokenizerChunk>* GetTokenizer(
      grpc::CallbackServerContext* context,
      const ::smg::grpc::common::GetTokenizerRequest* request) override;
  grpc::ServerWriteReactor<::smg::grpc::common::KvEventBatch>* SubscribeKvEvents(
      grpc::CallbackServerContext* context,
      const ::smg::grpc::common::SubscribeKvEventsRequest* request) override;
  grpc::ServerUnaryReactor* LoadLoRAAdapter(
      grpc::CallbackServerContext* context,
      const ::sglang::grpc::scheduler::LoadLoRAAdapterRequest* request,
      ::sglang::grpc::scheduler::LoadLoRAAdapterResponse* response) override;
  grpc::ServerUnaryReactor* UnloadLoRAAdapter(
      grpc::CallbackServerContext* context,
      const ::sglang::grpc::scheduler::UnloadLoRAAdapterRequest* request,
      ::sglang::grpc::scheduler::UnloadLoRAAdapterResponse* response) override;
  grpc::ServerUnaryReactor* ListLoadedLoRAAdapters(
      grpc::CallbackServerContext* context,
      const ::sglang::grpc::scheduler::ListLoadedLoRAAdaptersRequest* request,
      ::sglang::grpc::scheduler::ListLoadedLoRAAdaptersResponse* response) override;

 private:
  // The key checks; a refusal for a missing key is logged with the way out (rate-limited).
  absl::Status CheckData(const grpc::CallbackServerContext& context, const char* method);
  absl::Status CheckAdmin(const grpc::CallbackServerContext& context, const char* method);
  void WarnMissingKey(const absl::Status& s, const char* method);
  // The name reported as served_model_name: --model-alias, else the model path.
  const std::string& served_model_name() const;

  // Answers one FlushCache call from the flush's final status.
  static void FinishFlush(grpc::ServerUnaryReactor* reactor,
                          ::smg::grpc::common::FlushCacheResponse* response, const absl::Status& s,
                          float timeout_s);

  GenerateHost& host_;
  WorkerControl& control_;
  const WorkerConfig& config_;
  PauseGuard& pause_guard_;
  BoundedExecutor& executor_;  // FlushCache retries, KV event subscriptions
  const BearerAuth& data_auth_;
  const BearerAuth& admin_auth_;
  const std::chrono::system_clock::time_point start_time_;
  std::atomic<int64_t> last_key_warning_s_{0};
  std::atomic<double> last_receive_unix_s_{0};
  sglang::TokenizerBundle tokenizer_bundle_;
  FlushWaiter flushes_;
};

}  // namespace rl::worker
