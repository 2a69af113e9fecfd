// rl-router: the trainers' entry point (rl.v1.Router + the rl.v1.Admin fan-out).
// Flags are read here only, turned into a RouterConfig and validated.
#include "common/auth.h"
#include "common/flags.h"
#include "common/request_limits.h"
#include "common/server_main.h"
#include "services/router/router_server.h"

int main(int argc, char** argv) {
  rl::router::RouterConfig c;
  rl::FlagSet flags("rl-router");
  flags.String("host", &c.host, "address to bind");
  flags.Int("port", &c.port, "gRPC port (0 picks a free one)");
  flags.String("tokenizer", &c.tokenizer_path, "folder with tokenizer.json (the model folder)");
  flags.StringList("worker", &c.workers, "rl-worker address HOST:PORT (repeatable)");
  flags.StringList("worker-dns", &c.worker_dns,
                   "NAME:PORT: every address NAME resolves to is a worker at PORT, re-resolved "
                   "every --dns-interval-ms; vanished ones are removed (repeatable)");
  flags.String("dns-server", &c.dns_server,
               "HOST:PORT of the DNS server for --worker-dns (default: the system's resolv.conf)");
  flags.Int("dns-interval-ms", &c.dns_interval_ms, "how often --worker-dns names are re-resolved");
  const rl::ServerKeyFlags keys = {&c.admin_api_key, &c.admin_api_key_file, &c.api_key,
                                   &c.api_key_file};
  rl::RegisterServerKeyFlags(flags, keys, "Generate/Retrieve");
  rl::RegisterRequestLimitFlags(flags, &c.limits);
  flags.Int("metrics-port", &c.metrics_port, "Prometheus HTTP port (-1 off, 0 any)");
  flags.Int("max-cache-size", &c.max_cache_size, "text cache size in tokens before GC");
  flags.Int("gc-threshold-k", &c.gc_threshold_k, "GC removes versions <= current - k");
  flags.String("cache-dir", &c.cache_dir,
               "folder of the durable text cache and fleet state (recovered at start-up); empty: "
               "memory only, a restart forgets every trajectory");
  flags.Int("max-cache-disk-bytes", &c.max_cache_disk_bytes,
            "bound on the --cache-dir store on disk; GC runs early near it");
  flags.String("cache-store-failure", &c.cache_store_failure,
               "while the --cache-dir store cannot write (disk full, I/O error): refuse (text "
               "prompts answered UNAVAILABLE naming the store, retryable) or serve (answered, "
               "marked trajectory_not_durable)");
  flags.Int("cache-store-retry-ms", &c.cache_store_retry_ms,
            "after a failed write, how often the store tries to write the whole cache again");
  flags.Int("max-attempts", &c.max_attempts, "attempts per generation (retries + 1)");
  flags.Int("retry-backoff-ms", &c.retry_backoff_ms, "first retry backoff, doubled per retry");
  flags.Int("hold-wait-ms", &c.hold_wait_ms,
            "how long a generation waits for workers that an admin broadcast took out of routing");
  flags.Int("max-version-lag", &c.max_version_lag,
            "staleness bound sent with requests that set no max_version_lag: a request the weight "
            "version moved more than this past its dispatch version ends with finish reason "
            "stale and its partial output, never retried (-1: none)");
  flags.Int("admin-lock-timeout-ms", &c.admin_lock_timeout_ms,
            "wait for the admin lock before UNAVAILABLE");
  flags.Int("admin-call-timeout-ms", &c.admin_call_timeout_ms,
            "per-worker deadline of pause/continue/flush/destroy-group and read-only admin calls");
  flags.Int("admin-load-timeout-ms", &c.admin_load_timeout_ms,
            "per-worker deadline of weight updates, group init, sleep and wake");
  flags.String("router-id", &c.router_id,
               "this router's name as the owner of its workers' admin leases (default: "
               "HOSTNAME-PID)");
  flags.Int("admin-lease-ttl-ms", &c.admin_lease_ttl_ms,
            "admin fencing: a worker takes control calls from this router only, and refuses "
            "other routers', until this long after this router's last call (renewed while it "
            "lives); 0: off, no lease asked");
  flags.Int("health-interval-ms", &c.health_interval_ms, "worker health check interval");
  flags.Int("health-timeout-ms", &c.health_timeout_ms, "deadline of one worker health check");
  flags.Int("health-failures", &c.health_failure_threshold,
            "failed checks before a worker is dead");
  flags.Int("health-successes", &c.health_success_threshold,
            "passed checks before a dead worker is live");
  flags.String("policy", &c.policy,
               "routing policy: round_robin, least_load, affinity (routing key / group / "
               "trajectory, bounded load) or cache_aware (longest cached prefix, bounded load)");
  flags.Double("load-factor", &c.load_factor,
               "affinity/cache_aware: a preferred worker takes a request only within this many "
               "times the fleet's mean load, or --load-slack samples above it");
  flags.Int("load-slack", &c.load_slack,
            "affinity/cache_aware: samples a preferred worker may hold above the fleet's mean "
            "load whatever --load-factor says (8: a GRPO group of 8 stays together)");
  flags.Int("max-in-flight", &c.max_in_flight,
            "generations running at once (0: the workers' capacity, the sum of their "
            "--max-running-requests); more wait in fair per-client queues");
  flags.Int("max-queued", &c.max_queued,
            "generations waiting for a slot; beyond, RESOURCE_EXHAUSTED at once");
  flags.Int("max-stream-buffer-bytes", &c.max_stream_buffer_bytes,
            "bytes queued for a client that does not read its stream before it is cancelled");
  flags.Int("blocking-threads", &c.blocking_threads,
            "threads for tokenizing long prompts and cache inserts");
  flags.Int("admin-threads", &c.admin_threads,
            "threads that wait on admin broadcasts (one each) and AddWorker checks");
  flags.Double("drain-grace-s", &c.drain_grace_s,
               "on SIGTERM: refuse new generations and admin calls, let the streams in flight "
               "finish for up to this long, then stop");
  flags.Int("sglang-port", &c.sglang_port,
            "also serve SGLang's scheduler protocol for the SMG gateway here, with no key "
            "(-1 off, 0 any; the main port serves it behind --api-key)");
  flags.Int("max-episodes", &c.max_episodes,
            "agent episodes held; beyond, the least recently used is dropped");
  flags.Int("max-episode-turns", &c.max_episode_turns, "turns recorded per episode");
  flags.Int("max-episode-tokens", &c.max_episode_tokens,
            "tokens recorded per episode (all its turns' trajectories)");
  flags.Int("episode-ttl-s", &c.episode_ttl_s, "an episode idle this long is dropped");
  flags.Int("resume-store-entries", &c.resume_store_entries,
            "partial samples (requests that ended abort or stale with output) kept for a resume "
            "by request id; beyond, the least recently used is dropped (0: off)");
  flags.Int("resume-store-bytes", &c.resume_store_bytes,
            "bound on the kept partial samples' serialized bytes (least recently used dropped)");
  rl::MainOptions options{
      .program = "rl-router", .flags = &flags, .log_level = &c.log_level, .keys = keys};
  return rl::RunServerMain(
      argc, argv, options, [&] { return rl::router::RouterServer::Start(c); },
      [](rl::router::RouterServer& server) {
        if (!server.sglang_address().empty()) {
          rl::AnnounceListening(server.sglang_address(), "sglang");
        }
      });
}
