// RouterService: rl.v1.Router, the trainers' entry point. It wires what its calls share (the
// generation environment, admission, the request table, the metric table) and translates the
// unary RPCs: RetrieveFromText (the text cache, or the prompt a Generate would send), the
// worker-pool calls (admin key), GetMetrics. Generate runs on its own reactor
// (generate_reactor.h); Router.Abort forwarding is router_abort.cc. Both are asynchronous: no
// thread waits on a stream or a forwarded abort.
// docs/life-of-a-request.md follows one request through every layer, with file names.
//
// Admission (admission.h): at most --max-in-flight generations run, --max-queued more wait in
// fair per-client queues (client: the `rl-client-id` header, else the peer), the rest are
// refused RESOURCE_EXHAUSTED at once. Blocking work (tokenizing long prompts and texts to
// retrieve, cache inserts) runs on the small `blocking` pool, AddWorker's check of the new worker
// on the bounded admin executor. Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/bounded_executor.h"
#include "common/drain_gate.h"
#include "common/metrics.h"
#include "common/request_limits.h"
#include "common/tokenizer/tokenizer.h"
#include "rl/v1/router.grpc.pb.h"
#include "services/router/admin/admin_lock.h"
#include "services/router/admission.h"
#include "services/router/cache/prompt_resolver.h"
#include "services/router/cache/text_cache.h"
#include "services/router/episodes/episode_store.h"
#include "services/router/generate_reactor.h"
#include "services/router/generation.h"
#include "services/router/pool/worker_pool.h"
#include "services/router/request_table.h"
#include "services/router/router_metrics.h"
#include "services/router/state/fleet_record.h"

namespace rl::router {

struct RouterServiceOptions {
  RetryOptions retry;
  RequestLimits limits;  // the --max-* request limits (checked before tokenization)
  AdmissionOptions admission;
  int64_t max_stream_buffer_bytes = 4 << 20;
  BoundedExecutor* blocking = nullptr;  // tokenization of long prompts, cache inserts
  BoundedExecutor* admin = nullptr;     // AddWorker checks
  // While the router drains (SIGTERM): Generate and the pool's changes (AddWorker,
  // RemoveWorker, SetWorkerEnabled) are refused UNAVAILABLE; streams in flight go on. May be null.
  const DrainGate* drain = nullptr;
  EpisodeStore* episodes = nullptr;     // agent episodes (null: none recorded, GetEpisode fails)
  ResumeStore* resume_store = nullptr;  // partial samples for resume by id (null: refused)
  // --max-version-lag: the staleness bound sent with requests that set none (-1: none).
  int32_t max_version_lag = -1;
  // Persists AddWorker / RemoveWorker (with --cache-dir; null: not kept across restarts).
  FleetRecord* fleet_record = nullptr;
  // --cache-store-failure refuse (generate_reactor.h).
  bool refuse_when_store_failed = false;
};

class RouterService final : public rl::v1::Router::CallbackService {
 public:
  // Registers the router's metrics in `metrics`. Every pointer must outlive the service.
  RouterService(WorkerPool* pool, TextCache* cache, const tokenizer::Tokenizer* tokenizer,
                const BearerAuth* data_auth, const BearerAuth* admin_auth, MetricsRegistry* metrics,
                const RouterServiceOptions& options);
  ~RouterService() override;  // waits for the generations still winding down
  // The admin lock AdoptWorkerVersion takes, so that it never interleaves with a weight update,
  // a refit or a catch-up (set once, before serving; without it adopt takes none).
  void SetAdminLock(admin::AdminLock* lock) { admin_lock_ = lock; }

  grpc::ServerWriteReactor<rl::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const rl::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* RetrieveFromText(grpc::CallbackServerContext* context,
                                             const rl::v1::RetrieveFromTextRequest* request,
                                             rl::v1::RetrieveFromTextResponse* response) override;
  grpc::ServerUnaryReactor* AddWorker(grpc::CallbackServerContext* context,
                                      const rl::v1::AddWorkerRequest* request,
                                      rl::v1::WorkerListResponse* response) override;
  grpc::ServerUnaryReactor* RemoveWorker(grpc::CallbackServerContext* context,
                                         const rl::v1::RemoveWorkerRequest* request,
                                         rl::v1::WorkerListResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const rl::v1::ListWorkersRequest* request,
                                        rl::v1::WorkerListResponse* response) override;
  grpc::ServerUnaryReactor* SetWorkerEnabled(grpc::CallbackServerContext* context,
                                             const rl::v1::SetWorkerEnabledRequest* request,
                                             rl::v1::WorkerListResponse* response) override;
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* context,
                                       const rl::v1::GetMetricsRequest* request,
                                       rl::v1::GetMetricsResponse* response) override;
  grpc::ServerUnaryReactor* GetEpisode(grpc::CallbackServerContext* context,
                                       const rl::v1::GetEpisodeRequest* request,
                                       rl::v1::GetEpisodeResponse* response) override;
  grpc::ServerUnaryReactor* AdoptWorkerVersion(grpc::CallbackServerContext* context,
                                               const rl::v1::AdoptWorkerVersionRequest* request,
                                               rl::v1::WorkerListResponse* response) override;
  // router_abort.cc
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const rl::v1::AbortRequest* request,
                                  rl::v1::AbortResponse* response) override;
  // Router.Abort's work: forwards to the workers with asynchronous calls (no thread waits) and
  // calls `done` with the number aborted (on a gRPC thread, or inline when nothing is sent).
  void AbortRequests(const rl::v1::AbortRequest& request, std::optional<std::string> authorization,
                     std::function<void(absl::StatusOr<int32_t>)> done);

  // The address this router listens on (AddWorker refuses it); set once the server has its port.
  void SetOwnAddress(const std::string& host, int port) ABSL_LOCKS_EXCLUDED(own_mu_);
  // Applies the fleet's capacity to an automatic admission bound (--max-in-flight 0).
  Admission& admission() { return admission_; }

  // Blocks until no Generate stream is alive (after the server stopped taking calls).
  void WaitForGenerations() { live_.WaitForNone(); }
  // Waits at most `timeout` for no generation to be alive; false when some still are.
  bool WaitForGenerationsFor(absl::Duration timeout) { return live_.WaitForNoneFor(timeout); }
  WorkerPool* pool() const { return pool_; }
  RequestTable* requests() { return &requests_; }

 private:
  // OK unless the router drains (options_.drain).
  absl::Status CheckNotDraining(absl::string_view what) const;
  // RetrieveFromText with tokenize_remainder: the prompt a Generate of `text` would send.
  // Sets cache_history_unknown (and counts it) when the cache keeps no durable store.
  void MarkHistory(rl::v1::RetrieveFromTextResponse* response);
  absl::Status ResolveForRetrieve(const std::string& text,
                                  rl::v1::RetrieveFromTextResponse* response);

  WorkerPool* const pool_;
  TextCache* const cache_;
  const tokenizer::Tokenizer* const tokenizer_;
  const BearerAuth* const data_auth_;
  const BearerAuth* const admin_auth_;
  admin::AdminLock* admin_lock_ = nullptr;
  const RouterServiceOptions options_;
  const RequestLimits& limits_ = options_.limits;
  mutable SeamCounters seam_counters_;
  RequestTable requests_;
  Admission admission_;
  RouterMetrics metrics_;
  GenerationEnv env_;
  LiveGenerations live_;
  GenerateContext generate_;
  // Router.Abort calls forwarding now (bounded by kMaxAbortsInFlight).
  std::atomic<int> aborts_in_flight_{0};
  absl::Mutex own_mu_;
  std::string own_host_ ABSL_GUARDED_BY(own_mu_);
  int own_port_ ABSL_GUARDED_BY(own_mu_) = -1;
};

}  // namespace rl::router
