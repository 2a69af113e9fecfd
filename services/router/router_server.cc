#include "services/router/router_server.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "grpcpp/server.h"
#include "grpcpp/support/channel_arguments.h"
#include "services/router/episodes/episode_metrics.h"
#include "services/router/pool/policies/make_policy.h"
#include "spdlog/spdlog.h"

namespace rl::router {
namespace {

// The text cache learns of fleet version bumps from the pool: its GC threshold follows the
// fleet's weight version.
class CacheFollowsFleet final : public FleetObserver {
 public:
  CacheFollowsFleet(TextCache* cache, EpisodeStore* episodes)
      : cache_(cache), episodes_(episodes) {}
  void OnFleetWeights(const FleetWeights& before, const FleetWeights& after) override {
    if (after.version >= 0 && after.version != before.version) {
      cache_->SetCurrentVersion(after.version);
      episodes_->SetCurrentVersion(after.version);
    }
  }

 private:
  TextCache* const cache_;
  EpisodeStore* const episodes_;
};

}  // namespace

absl::Status Validate(const RouterConfig& c) {
  const auto bad = [](const char* flag, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", why));
  };
  if (c.tokenizer_path.empty()) return bad("tokenizer", "required (a folder with tokenizer.json)");
  if (c.port < 0 || c.port > 65535) return bad("port", "must be in [0, 65535]");
  if (c.metrics_port < -1 || c.metrics_port > 65535)
    return bad("metrics-port", "must be -1 or in [0, 65535]");
  if (c.max_cache_size <= 0) return bad("max-cache-size", "must be > 0 (tokens)");
  if (c.gc_threshold_k < 0) return bad("gc-threshold-k", "must be >= 0");
  if (!c.cache_dir.empty()) {
    CacheStoreOptions store;
    store.dir = c.cache_dir;
    store.max_disk_bytes = c.max_cache_disk_bytes;
    store.retry_interval = std::chrono::milliseconds(c.cache_store_retry_ms);
    RETURN_IF_ERROR(store.Validate());
  }
  if (c.cache_store_failure != "refuse" && c.cache_store_failure != "serve") {
    return bad("cache-store-failure",
               absl::StrCat("must be refuse or serve, got '", c.cache_store_failure, "'"));
  }
  if (c.cache_store_retry_ms < 1 || c.cache_store_retry_ms > 3600000) {
    return bad("cache-store-retry-ms", "must be in [1, 3600000]");
  }
  if (c.max_attempts < 1 || c.max_attempts > 100) return bad("max-attempts", "must be in [1, 100]");
  if (c.retry_backoff_ms < 0) return bad("retry-backoff-ms", "must be >= 0");
  if (c.hold_wait_ms < 0) return bad("hold-wait-ms", "must be >= 0");
  if (c.max_version_lag < -1) return bad("max-version-lag", "must be >= 0, or -1 for none");
  if (c.admin_lock_timeout_ms < 1) return bad("admin-lock-timeout-ms", "must be >= 1");
  if (c.admin_call_timeout_ms < 1) return bad("admin-call-timeout-ms", "must be >= 1");
  if (c.admin_load_timeout_ms < 1) return bad("admin-load-timeout-ms", "must be >= 1");
  for (const std::string& target : c.worker_dns) {
    if (absl::StatusOr<discovery::DnsTarget> t = discovery::ParseDnsTarget(target); !t.ok()) {
      return t.status();
    }
  }
  if (c.admin_lease_ttl_ms != 0 && (c.admin_lease_ttl_ms < 100 || c.admin_lease_ttl_ms > 3600000)) {
    return bad("admin-lease-ttl-ms", "must be 0 (off) or in [100, 3600000]");
  }
  if (c.router_id.size() > 128) return bad("router-id", "must be at most 128 bytes");
  for (char ch : c.router_id) {
    if (ch < 0x21 || ch > 0x7e) return bad("router-id", "printable ASCII without spaces only");
  }
  if (c.dns_interval_ms < 100) return bad("dns-interval-ms", "must be >= 100");
  if (!c.dns_server.empty() && c.worker_dns.empty()) return bad("dns-server", "needs --worker-dns");
  if (!(c.drain_grace_s >= 0 && c.drain_grace_s <= 86400)) {
    return bad("drain-grace-s", "must be in [0, 86400]");
  }
  if (c.health_interval_ms < 10) return bad("health-interval-ms", "must be >= 10");
  if (c.health_timeout_ms < 1) return bad("health-timeout-ms", "must be >= 1");
  if (c.health_failure_threshold < 1) return bad("health-failures", "must be >= 1");
  if (c.health_success_threshold < 1) return bad("health-successes", "must be >= 1");
  if (c.max_in_flight < 0 || c.max_in_flight > 1000000)
    return bad("max-in-flight", "must be 0 (the workers' capacity) or in [1, 1000000]");
  if (c.max_queued < 0 || c.max_queued > 1000000)
    return bad("max-queued", "must be in [0, 1000000]");
  if (c.max_stream_buffer_bytes < 1024) return bad("max-stream-buffer-bytes", "must be >= 1024");
  if (c.blocking_threads < 1 || c.blocking_threads > 64)
    return bad("blocking-threads", "must be in [1, 64]");
  if (c.admin_threads < 1 || c.admin_threads > 64)
    return bad("admin-threads", "must be in [1, 64]");
  RETURN_IF_ERROR(ValidatePolicyOptions({c.policy, c.load_factor, c.load_slack}));
  if (c.sglang_port < -1 || c.sglang_port > 65535)
    return bad("sglang-port", "must be -1 or in [0, 65535]");
  if (c.max_episodes < 1) return bad("max-episodes", "must be >= 1");
  if (c.resume_store_entries < 0) return bad("resume-store-entries", "must be >= 0 (0: off)");
  if (c.resume_store_bytes < 1) return bad("resume-store-bytes", "must be >= 1");
  if (c.max_episode_turns < 1) return bad("max-episode-turns", "must be >= 1");
  if (c.max_episode_tokens < 1) return bad("max-episode-tokens", "must be >= 1");
  if (c.episode_ttl_s < 1) return bad("episode-ttl-s", "must be >= 1");
  RETURN_IF_ERROR(ValidateRequestLimits(c.limits));
  for (const std::string& w : c.workers) {
    if (absl::Status s = CheckAddress(w, c.limits); !s.ok()) return Annotate(s, "--worker");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(const RouterConfig& config) {
  RETURN_IF_ERROR(Validate(config));
  std::unique_ptr<RouterServer> s(new RouterServer());
  s->config_ = config;
  ASSIGN_OR_RETURN(s->tokenizer_, tokenizer::Tokenizer::FromDir(config.tokenizer_path));
  TextCacheOptions cache_options;
  cache_options.max_cache_size = config.max_cache_size;
  cache_options.gc_threshold_k = config.gc_threshold_k;
  if (!config.cache_dir.empty()) {
    // Recovered here, before the server takes any call. A write past RLIMIT_FSIZE fails (EFBIG)
    // like one on a full disk, instead of killing the router: the store reports it and recovers.
    signal(SIGXFSZ, SIG_IGN);
    CacheStoreOptions store_options;
    store_options.dir = config.cache_dir;
    store_options.max_disk_bytes = config.max_cache_disk_bytes;
    store_options.retry_interval = std::chrono::milliseconds(config.cache_store_retry_ms);
    const auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(s->store_, CacheStore::Open(store_options));
    ASSIGN_OR_RETURN(s->cache_, TextCache::Create(cache_options, s->store_.get()));
    const TextCacheStats stats = s->cache_->GetStats();
    spdlog::info("text cache recovered from {}: {} tokens in {} nodes, weight version {}, {:.3f} s",
                 s->store_->path(), stats.size_tokens, stats.entries, stats.current_version,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } else {
    spdlog::warn(
        "no --cache-dir: the text cache lives in memory only; a restart forgets every trajectory "
        "and text-prompt answers say cache_history_unknown");
    ASSIGN_OR_RETURN(s->cache_, TextCache::Create(cache_options));
  }
  EpisodeOptions episode_options;
  episode_options.max_episodes = config.max_episodes;
  episode_options.max_turns = config.max_episode_turns;
  episode_options.max_episode_tokens = config.max_episode_tokens;
  episode_options.ttl = std::chrono::seconds(config.episode_ttl_s);
  episode_options.gc_threshold_k = config.gc_threshold_k;
  RETURN_IF_ERROR(episode_options.Validate());
  s->episodes_ = std::make_unique<EpisodeStore>(episode_options);
  s->resume_store_ = std::make_unique<ResumeStore>(
      ResumeStoreOptions{config.resume_store_entries, config.resume_store_bytes});
  RegisterEpisodeMetrics(&s->metrics_, s->episodes_.get());
  PoolOptions pool_options;
  pool_options.health_interval = std::chrono::milliseconds(config.health_interval_ms);
  pool_options.health_timeout = std::chrono::milliseconds(config.health_timeout_ms);
  pool_options.failure_threshold = config.health_failure_threshold;
  pool_options.success_threshold = config.health_success_threshold;
  ASSIGN_OR_RETURN(std::unique_ptr<RoutingPolicy> policy,
                   MakeRoutingPolicy({config.policy, config.load_factor, config.load_slack}));
  s->pool_ = std::make_unique<WorkerPool>(pool_options, std::move(policy));
  s->cache_follows_fleet_ =
      std::make_unique<CacheFollowsFleet>(s->cache_.get(), s->episodes_.get());
  s->pool_->AddObserver(s->cache_follows_fleet_.get());
  if (s->store_ != nullptr) {
    // The fleet's record first, then the workers: each is judged against it (fleet_record.h).
    s->fleet_record_ = std::make_unique<FleetRecord>(s->store_.get());
    RETURN_IF_ERROR(s->fleet_record_->Restore(s->pool_.get()));
    s->pool_->AddObserver(s->fleet_record_.get());
  }
  // Requests wait for a slot in the router's fair queues, not in a worker's FIFO queue: with
  // --max-in-flight 0 the bound is what the workers run at once (set below, once the service
  // exists, and followed as workers join, leave or report their capacity).
  // With a record, the workers added and removed at run time too (fleet_record.h).
  const std::vector<std::string> start_workers =
      s->fleet_record_ != nullptr ? s->fleet_record_->StartWorkers(config.workers) : config.workers;
  RETURN_IF_ERROR(s->pool_->AddAll(start_workers));
  if (!config.worker_dns.empty()) {
    discovery::DnsResolverOptions dns;
    dns.server = config.dns_server;
    ASSIGN_OR_RETURN(s->resolver_, discovery::DnsResolver::Create(dns));
    std::vector<discovery::DnsTarget> targets;
    for (const std::string& t : config.worker_dns) {
      ASSIGN_OR_RETURN(discovery::DnsTarget target, discovery::ParseDnsTarget(t));
      targets.push_back(std::move(target));
    }
    WorkerPool* const pool = s->pool_.get();
    discovery::DnsResolver* const resolver = s->resolver_.get();
    // A --worker address is the operator's: discovery never removes it.
    const std::vector<std::string> fixed = config.workers;
    discovery::WorkerDiscovery::Pool ops;
    ops.add = [pool](const std::string& address) { return pool->Add(address); };
    ops.remove = [pool, fixed](const std::string& address) {
      if (std::find(fixed.begin(), fixed.end(), address) != fixed.end()) {
        return absl::OkStatus();
      }
      return pool->Remove(address);
    };
    discovery::DiscoveryOptions options;
    options.interval = std::chrono::milliseconds(config.dns_interval_ms);
    options.retry = std::min(options.interval, std::chrono::milliseconds(1000));
    s->discovery_ = std::make_unique<discovery::WorkerDiscovery>(
        std::move(targets), [resolver](const std::string& name) { return resolver->Resolve(name); },
        std::move(ops), options);
  }
  s->admin_auth_ = std::make_unique<BearerAuth>(config.admin_api_key);
  s->data_auth_ = std::make_unique<BearerAuth>(config.api_key);
  // Every in-flight generation has at most one blocking task queued at a time.
  s->blocking_ = std::make_unique<BoundedExecutor>(
      "rl-blocking", config.blocking_threads,
      static_cast<size_t>(config.max_in_flight > 0 ? config.max_in_flight : 1000000) + 64);
  s->admin_executor_ = std::make_unique<BoundedExecutor>("rl-admin", config.admin_threads, 256);
  RouterServiceOptions service;
  service.retry.max_attempts = config.max_attempts;
  service.retry.backoff = std::chrono::milliseconds(config.retry_backoff_ms);
  service.retry.hold_wait = std::chrono::milliseconds(config.hold_wait_ms);
  service.limits = config.limits;
  service.admission.max_in_flight = config.max_in_flight;
  service.admission.max_queued = config.max_queued;
  service.max_stream_buffer_bytes = config.max_stream_buffer_bytes;
  service.blocking = s->blocking_.get();
  service.admin = s->admin_executor_.get();
  service.drain = &s->drain_;
  service.episodes = s->episodes_.get();
  service.resume_store = s->resume_store_.get();
  service.max_version_lag = config.max_version_lag;
  service.fleet_record = s->fleet_record_.get();
  service.refuse_when_store_failed = config.cache_store_failure == "refuse";
  s->router_service_ = std::make_unique<RouterService>(s->pool_.get(), s->cache_.get(),
                                                       s->tokenizer_.get(), s->data_auth_.get(),
                                                       s->admin_auth_.get(), &s->metrics_, service);
  if (config.max_in_flight == 0) {
    RouterService* service_ptr = s->router_service_.get();
    auto follow = [service_ptr](int64_t capacity) {
      // No worker yet (or none reported): as many as one default worker runs, so that requests
      // fail fast instead of queueing for a fleet that is not there.
      service_ptr->admission().SetLimit(static_cast<int>(
          std::min<int64_t>(capacity > 0 ? capacity : kDefaultWorkerCapacity, 1000000)));
    };
    follow(s->pool_->Capacity());
    s->pool_->SetCapacityObserver(follow);
  }
  admin::AdminOptions admin;
  admin.broadcast.lock_timeout = std::chrono::milliseconds(config.admin_lock_timeout_ms);
  admin.broadcast.control_timeout = std::chrono::milliseconds(config.admin_call_timeout_ms);
  admin.broadcast.load_timeout = std::chrono::milliseconds(config.admin_load_timeout_ms);
  admin.broadcast.worker_admin_key = config.admin_api_key;
  if (config.admin_lease_ttl_ms > 0) {
    admin.broadcast.lease_owner = config.router_id;
    if (admin.broadcast.lease_owner.empty()) {
      char host[256] = {};
      gethostname(host, sizeof(host) - 1);
      admin.broadcast.lease_owner = absl::StrCat(host, "-", getpid());
    }
    admin.broadcast.lease_ttl = std::chrono::milliseconds(config.admin_lease_ttl_ms);
  }
  admin.executor = s->admin_executor_.get();
  admin.limits = config.limits;
  admin.drain = &s->drain_;
  s->admin_service_ =
      std::make_unique<admin::AdminService>(s->pool_.get(), s->admin_auth_.get(), admin);
  s->router_service_->SetAdminLock(&s->admin_service_->lock());
  std::optional<std::string> self_authorization;
  if (!config.api_key.empty()) self_authorization = "Bearer " + config.api_key;
  const int32_t max_n = static_cast<int32_t>(config.limits.max_n);
  s->sglang_service_ = std::make_unique<RouterSglangService>(
      s->pool_.get(), s->router_service_.get(), s->tokenizer_.get(), config.tokenizer_path,
      self_authorization, s->data_auth_.get(), max_n, &s->drain_);
  ServerOptions options;
  options.host = config.host;
  options.port = config.port;
  // A tensor chunk plus its header (the admin fan-out forwards them); generate requests are far
  // smaller.
  options.max_message_bytes = static_cast<int>(std::min<int64_t>(
      std::max<int64_t>(config.limits.max_tensor_chunk_bytes + (1 << 20), 64 << 20), INT32_MAX));
  ASSIGN_OR_RETURN(s->grpc_,
                   GrpcServer::Start(options, {s->router_service_.get(), s->admin_service_.get(),
                                               s->sglang_service_.get()}));
  s->router_service_->SetOwnAddress(config.host, s->grpc_->port());
  s->grpc_->SetServiceServing(kReadinessService, true);
  grpc::ChannelArguments self_args;
  self_args.SetMaxReceiveMessageSize(-1);
  std::shared_ptr<grpc::Channel> self = s->grpc_->server()->InProcessChannel(self_args);
  s->sglang_service_->Connect(self);
  if (config.sglang_port >= 0) {
    // SMG's gRPC client sends no metadata: this listener takes no key, and only the gateway
    // must reach it (docs/episodes.md).
    s->no_auth_ = std::make_unique<BearerAuth>("");
    s->sglang_open_service_ = std::make_unique<RouterSglangService>(
        s->pool_.get(), s->router_service_.get(), s->tokenizer_.get(), config.tokenizer_path,
        self_authorization, s->no_auth_.get(), max_n, &s->drain_);
    s->sglang_open_service_->Connect(self);
    ServerOptions sglang_options = options;
    sglang_options.port = config.sglang_port;
    sglang_options.max_message_bytes = 64 << 20;  // token ids only
    ASSIGN_OR_RETURN(s->sglang_grpc_,
                     GrpcServer::Start(sglang_options, {s->sglang_open_service_.get()}));
    if (s->data_auth_->enabled()) {
      spdlog::warn(
          "--sglang-port: SGLang's scheduler protocol on {} takes no API key (the SMG gateway "
          "sends none); only the gateway must reach that address",
          s->sglang_grpc_->address());
    }
  }
  if (config.metrics_port >= 0) {
    ASSIGN_OR_RETURN(s->metrics_http_,
                     MetricsHttpServer::Start(config.host, config.metrics_port, &s->metrics_));
  }
  RouterServer* raw = s.get();
  s->sglang_readiness_ = std::make_unique<ReadinessWatch>(
      [raw] { return SglangReadinessOf(*raw->pool_, raw->drain_.draining()).ready; },
      [raw](bool ready) {
        raw->grpc_->SetServiceServing(kSglangReadinessService, ready);
        if (raw->sglang_grpc_) {
          raw->sglang_grpc_->SetServiceServing(kSglangReadinessService, ready);
          raw->sglang_grpc_->SetServiceServing(kReadinessService, ready);
        }
      },
      std::chrono::milliseconds(config.health_interval_ms));
  return s;
}

RouterServer::~RouterServer() { Shutdown(); }

bool RouterServer::Drain() {
  if (shut_down_) return true;
  drain_.Begin();
  if (grpc_) grpc_->SetServiceServing(kReadinessService, false);
  if (sglang_readiness_) sglang_readiness_->Refresh();  // NOT_SERVING now, not an interval later
  spdlog::info(
      "draining: new generations and admin calls refused; up to {}s for the streams in "
      "flight",
      config_.drain_grace_s);
  const bool all = router_service_->WaitForGenerationsFor(
      absl::Milliseconds(static_cast<int64_t>(config_.drain_grace_s * 1e3)));
  if (all) {
    spdlog::info("drained: no generation in flight");
  } else {
    spdlog::warn("drain grace period ({}s) over with generations still in flight",
                 config_.drain_grace_s);
  }
  return all;
}

void RouterServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (pool_) pool_->SetCapacityObserver(nullptr);  // it points into the router service
  sglang_readiness_.reset();  // publishes nothing from now on (Shutdown sets NOT_SERVING)
  // Discovery first: no pool change from now on.
  discovery_.reset();
  if (sglang_grpc_) sglang_grpc_->Shutdown();
  if (grpc_) grpc_->Shutdown();
  // No call is taken any more: let the generations wind down, then run what is queued.
  if (router_service_) router_service_->WaitForGenerations();
  blocking_.reset();
  admin_executor_.reset();
  if (metrics_http_) metrics_http_->Stop();
}

}  // namespace rl::router
