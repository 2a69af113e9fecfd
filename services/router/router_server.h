// RouterServer: the rl-router process and its composition root. Owns and wires the worker pool,
// RouterServer: the rl-router process and its composition root. Owns and wires the worker pool,
// the text cache and the episode store (which follow the pool's fleet version through an
// observer), the tokenizer, the Router service, the Admin service, SGLang's scheduler protocol
// (main port, and --sglang-port without a key), health, reflection and the metrics endpoint; it
// decides nothing itself. Health: the overall status is liveness (SERVING until Shutdown); the
// service `rl.v1.Router` is readiness (NOT_SERVING once Drain began). The SGLang side's
// readiness (sglang/sglang_readiness.h: not draining and a routable worker) is published as
// `sglang.grpc.scheduler.SglangScheduler` on both listeners and as `rl.v1.Router` on
// --sglang-port, so the SMG gateway stops sending when the router could not route.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/auth.h"
#include "common/drain_gate.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/request_limits.h"
#include "common/server_runner.h"
#include "common/tokenizer/tokenizer.h"
#include "services/router/admin/admin_service.h"
#include "services/router/cache/cache_store.h"
#include "services/router/cache/text_cache.h"
#include "services/router/discovery/dns_resolver.h"
#include "services/router/discovery/worker_discovery.h"
#include "services/router/episodes/episode_store.h"
#include "services/router/pool/fleet_weights.h"
#include "services/router/pool/worker_pool.h"
#include "services/router/router_service.h"
#include "services/router/sglang/router_sglang_service.h"
#include "services/router/sglang/sglang_readiness.h"
#include "services/router/state/fleet_record.h"

namespace rl::router {

struct RouterConfig {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string tokenizer_path;
  std::vector<std::string> workers;
  // --worker-dns NAME:PORT (repeatable): workers found by DNS, re-resolved every
  // dns_interval_ms (services/router/discovery/worker_discovery.h).
  std::vector<std::string> worker_dns;
  std::string dns_server;  // "HOST:PORT" of the DNS server; "": the system's (/etc/resolv.conf)
  int dns_interval_ms = 5000;
  std::string admin_api_key;
  std::string api_key;
  std::string admin_api_key_file;  // read the admin key from this file (a mounted Secret)
  std::string api_key_file;        // read the data-plane key from this file
  RequestLimits limits;            // --max-* bounds on what a client may send
  int metrics_port = -1;
  int64_t max_cache_size = 1 << 24;
  // The text cache's durable store (cache_store.h); empty: memory only, and answers say so.
  std::string cache_dir;
  int64_t max_cache_disk_bytes = int64_t{8} << 30;
  // While the store has failed (disk full, I/O error): "refuse" text prompts UNAVAILABLE naming
  // the store, or "serve" them marked trajectory_not_durable. It retries every
  // cache_store_retry_ms and works again once the whole cache is written.
  std::string cache_store_failure = "refuse";
  int cache_store_retry_ms = 2000;
  int64_t gc_threshold_k = 2;
  int max_attempts = 3;
  int retry_backoff_ms = 50;
  int hold_wait_ms = 300000;
  // Staleness bound for requests that set no max_version_lag (-1: none).
  int max_version_lag = -1;
  int admin_lock_timeout_ms = 30000;
  int admin_call_timeout_ms = 10000;
  int admin_load_timeout_ms = 600000;
  // Admin fencing: this router's name as the owner of its workers' admin leases ("": the host
  // name and the process id), and the lease's length (0: no lease asked).
  std::string router_id;
  int admin_lease_ttl_ms = 0;
  int health_interval_ms = 1000;
  int health_timeout_ms = 2000;
  int health_failure_threshold = 2;
  int health_success_threshold = 1;
  // --policy, --load-factor, --load-slack (pool/routing_policy.h).
  std::string policy = "round_robin";
  double load_factor = 1.25;
  int load_slack = 8;
  // Data plane: admission, flow control and the blocking pool (router_service.h).
  int max_in_flight = 0;  // 0: the workers' capacity (admission.h)
  int max_queued = 16384;
  int64_t max_stream_buffer_bytes = 4 << 20;
  int blocking_threads = 2;
  int admin_threads = 8;
  // SIGTERM: how long the generations in flight may take to finish (RouterServer::Drain).
  double drain_grace_s = 30;
  // Agent episodes (episode_store.h); their version GC uses gc_threshold_k.
  int64_t max_episodes = 10000;
  int64_t max_episode_turns = 1024;
  int64_t max_episode_tokens = 1 << 22;
  int episode_ttl_s = 3600;
  // Partial samples kept for a resume by request id (resume_store.h; 0 entries: off).
  int64_t resume_store_entries = 4096;
  int64_t resume_store_bytes = int64_t{256} << 20;
  // A second listener for SGLang's scheduler protocol that takes no key (-1: none); the SMG
  // gateway sends none. The main port serves it too, behind the data key.
  int sglang_port = -1;
  std::string log_level = "info";
};

// InvalidArgument naming the first bad flag.
absl::Status Validate(const RouterConfig& config);

class RouterServer {
 public:
  static absl::StatusOr<std::unique_ptr<RouterServer>> Start(const RouterConfig& config);
  ~RouterServer();
  std::string address() const { return grpc_->address(); }
  // --sglang-port's listener ("" when off).
  std::string sglang_address() const { return sglang_grpc_ ? sglang_grpc_->address() : ""; }
  EpisodeStore& episodes() { return *episodes_; }
  int metrics_port() const { return metrics_http_ ? metrics_http_->port() : -1; }
  WorkerPool& pool() { return *pool_; }
  TextCache& cache() { return *cache_; }
  // The readiness service's name on grpc.health.v1.
  static constexpr char kReadinessService[] = "rl.v1.Router";
  // SIGTERM's first step (RunServerMain calls it before Shutdown): readiness off; Generate, the
  // admin calls and the pool's changes are refused UNAVAILABLE from now on; waits until every
  // generation in flight has ended, or `drain_grace_s` has passed. Returns whether all ended.
  // Idempotent.
  bool Drain();
  void Shutdown();

 private:
  RouterServer() = default;
  RouterConfig config_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<CacheStore> store_;  // outlives the cache
  std::unique_ptr<TextCache> cache_;
  std::unique_ptr<EpisodeStore> episodes_;
  std::unique_ptr<ResumeStore> resume_store_;
  // The cache's GC follows the fleet's weight version (declared before pool_: outlives it).
  std::unique_ptr<FleetObserver> cache_follows_fleet_;
  // Persists the fleet's weights and pause state (with --cache-dir; outlives pool_).
  std::unique_ptr<FleetRecord> fleet_record_;
  std::unique_ptr<BoundedExecutor> blocking_;
  std::unique_ptr<BoundedExecutor> admin_executor_;
  std::unique_ptr<WorkerPool> pool_;
  // --worker-dns: stopped in Shutdown, before the pool goes.
  std::unique_ptr<discovery::DnsResolver> resolver_;
  std::unique_ptr<discovery::WorkerDiscovery> discovery_;
  MetricsRegistry metrics_;
  DrainGate drain_{"rl-router"};
  std::unique_ptr<BearerAuth> admin_auth_;
  std::unique_ptr<BearerAuth> data_auth_;
  std::unique_ptr<RouterService> router_service_;
  std::unique_ptr<admin::AdminService> admin_service_;
  std::unique_ptr<BearerAuth> no_auth_;
  std::unique_ptr<RouterSglangService> sglang_service_;       // main port, data key
  std::unique_ptr<RouterSglangService> sglang_open_service_;  // --sglang-port, no key
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<GrpcServer> sglang_grpc_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  // Publishes the SGLang side's readiness on both listeners (declared last: stops first).
  std::unique_ptr<ReadinessWatch> sglang_readiness_;
  bool shut_down_ = false;
};

}  // namespace rl::router
