#include "services/router/router_metrics.h"

#include <utility>
#include <vector>

#include "services/router/cache/cache_store.h"

namespace rl::router {
namespace {

// The cache's figures, one gauge each.
struct CacheGauge {
  const char* name;
  const char* help;
  double (*get)(const TextCacheStats&);
};

constexpr CacheGauge kCacheGauges[] = {
    {"rl_router_cache_entries", "Nodes in the text cache.",
     [](const TextCacheStats& s) { return double(s.entries); }},
    {"rl_router_cache_hits_total", "Queries that matched cached tokens.",
     [](const TextCacheStats& s) { return double(s.hits); }},
    {"rl_router_cache_misses_total", "Queries that matched nothing.",
     [](const TextCacheStats& s) { return double(s.misses); }},
    {"rl_router_cache_hit_ratio", "hits / (hits + misses).",
     [](const TextCacheStats& s) { return s.hit_rate; }},
    {"rl_router_cache_size_tokens", "Cached tokens.",
     [](const TextCacheStats& s) { return double(s.size_tokens); }},
    {"rl_router_cache_size_bytes", "Cached text bytes.",
     [](const TextCacheStats& s) { return double(s.size_bytes); }},
    {"rl_router_cache_gc_runs_total", "Garbage collections.",
     [](const TextCacheStats& s) { return double(s.gc_runs); }},
    {"rl_router_cache_gc_removed_tokens_total", "Tokens removed by garbage collection.",
     [](const TextCacheStats& s) { return double(s.gc_removed_tokens); }},
    {"rl_router_cache_weight_version", "Newest weight version in the cache.",
     [](const TextCacheStats& s) { return double(s.current_version); }},
    {"rl_router_cache_max_cache_size", "GC runs when the cache holds more tokens than this.",
     [](const TextCacheStats& s) { return double(s.max_cache_size); }},
    {"rl_router_cache_gc_threshold_k", "GC removes versions <= current - this.",
     [](const TextCacheStats& s) { return double(s.gc_threshold_k); }},
};

constexpr char kWorkerPromptTokens[] = "rl_router_worker_prompt_tokens_total";
constexpr char kWorkerCachedTokens[] = "rl_router_worker_cached_tokens_total";

// Every worker's prompt and prefix-cached tokens, summed.
std::pair<int64_t, int64_t> PrefixTotals(const std::vector<rl::v1::WorkerStatus>& workers) {
  int64_t prompt = 0, cached = 0;
  for (const auto& w : workers) {
    prompt += w.prompt_tokens();
    cached += w.cached_prompt_tokens();
  }
  return {prompt, cached};
}

double Ratio(int64_t num, int64_t den) {
  return den > 0 ? static_cast<double>(num) / static_cast<double>(den) : 0;
}

}  // namespace

RouterMetrics::RouterMetrics(MetricsRegistry* registry, const WorkerPool* pool,
                             const TextCache* cache, const Admission* admission,
                             const SeamCounters* seam)
    : registry_(registry), pool_(pool), cache_(cache), seam_(seam) {
  MetricsRegistry& m = *registry;
  requests_total_ = m.GetCounter("rl_router_requests_total", "Generate requests accepted.");
  retries_total_ = m.GetCounter("rl_router_retries_total", "Generate attempts retried.");
  failures_total_ = m.GetCounter("rl_router_failures_total", "Generate requests that failed.");
  in_flight_ = m.GetGauge("rl_router_in_flight_requests", "Generate requests in flight.");
  rejected_total_ = m.GetCounter(
      "rl_router_rejected_total",
      "Generate requests refused RESOURCE_EXHAUSTED by admission (--max-in-flight, --max-queued).");
  overflows_total_ = m.GetCounter(
      "rl_router_stream_overflows_total",
      "Generate streams cancelled because the client did not read (--max-stream-buffer-bytes).");
  history_unknown_total_ = m.GetCounter(
      "rl_router_cache_history_unknown_answers_total",
      "Text-prompt answers that said cache_history_unknown: the router keeps no durable text "
      "cache, so trajectories from before its start are unknown to it.");
  m.SetGaugeCallback(
      "rl_router_cache_durable",
      "1 when the text cache has a working durable store (--cache-dir), 0 when it lives in "
      "memory only or its store failed.",
      {}, [cache] {
        return cache->store() != nullptr && !cache->store()->GetStats().failed ? 1.0 : 0.0;
      });
  m.SetGaugeCallback(
      "rl_router_cache_disk_bytes", "Bytes of the text cache's store on disk (database + log).", {},
      [cache] {
        return cache->store() != nullptr ? double(cache->store()->GetStats().disk_bytes) : 0.0;
      });
  m.SetGaugeCallback("rl_router_cache_store_commits_total",
                     "Transactions of the text cache's store (each holds every insert queued "
                     "since the one before).",
                     {}, [cache] {
                       return cache->store() != nullptr ? double(cache->store()->GetStats().commits)
                                                        : 0.0;
                     });
  m.SetGaugeCallback(
      "rl_router_cache_store_failures_total",
      "Commits of the text cache's store that failed (disk full, I/O error); "
      "resyncs that failed included.",
      {}, [cache] {
        return cache->store() != nullptr ? double(cache->store()->GetStats().failures) : 0.0;
      });
  m.SetGaugeCallback(
      "rl_router_cache_store_recoveries_total",
      "Resyncs that brought the text cache's store back after a failed commit "
      "(the whole cache written again).",
      {}, [cache] {
        return cache->store() != nullptr ? double(cache->store()->GetStats().recoveries) : 0.0;
      });
  m.SetGaugeCallback("rl_router_admission_queued",
                     "Generate requests waiting for an in-flight slot.", {},
                     [admission] { return double(admission->queued()); });
  for (const CacheGauge& g : kCacheGauges) {
    m.SetGaugeCallback(g.name, g.help, {}, [cache, get = g.get] { return get(cache->GetStats()); });
  }
  m.SetGaugeCallback(
      "rl_router_seam_continuations_total",
      "Text prompts whose rest after the last cached generated token was encoded as a "
      "continuation (the full-text encoding has no token boundary there).",
      {}, [seam] { return double(seam->seam_continuations.load()); });
  m.SetGaugeCallback(
      "rl_router_whole_text_fallbacks_total",
      "Text prompts whose tokens could not decode to the text exactly: served with the "
      "whole-text encoding, nothing reused.",
      {}, [seam] { return double(seam->whole_text_fallbacks.load()); });
  m.SetGaugeCallback("rl_router_live_workers", "Live workers.", {},
                     [pool] { return double(pool->LiveWorkers().size()); });
  m.SetGaugeCallback("rl_router_workers_weights_digest_mismatch",
                     "Live workers at the fleet's weight version whose weights_sha256 differs "
                     "from the fleet's (same version, other content): out of routing.",
                     {}, [pool] { return double(pool->DigestMismatches()); });
  // The routing policy (docs/routing.md, "Policies"), labelled by --policy.
  const Labels policy = {{"policy", pool->policy_name()}};
  m.SetGaugeCallback("rl_router_routing_picks_total", "Workers picked (retries included).", policy,
                     [pool] { return double(pool->routing_stats().picks); });
  m.SetGaugeCallback(
      "rl_router_routing_keyed_picks_total",
      "Picks placed by a preference: routing key, group id, cached trajectory or prefix.", policy,
      [pool] { return double(pool->routing_stats().keyed_picks); });
  m.SetGaugeCallback("rl_router_routing_key_moves_total",
                     "Picks that passed over a preferred worker above its load bound "
                     "(--load-factor times the fleet's mean, or --load-slack above it).",
                     policy, [pool] { return double(pool->routing_stats().key_moves); });
  m.SetGaugeCallback("rl_router_routing_load_spread",
                     "Max / mean load (samples in flight) of the routable workers now.", policy,
                     [pool] { return pool->LoadSpread(); });
  m.SetGaugeCallback("rl_router_routing_mean_load_spread",
                     "Max / mean load of the candidates right after each pick, averaged.", policy,
                     [pool] { return pool->routing_stats().mean_load_spread; });
  m.SetGaugeCallback(
      "rl_router_routing_prefix_hit_ratio",
      "Prompt tokens the workers served from their prefix caches / prompt tokens, as they report "
      "them in their final messages (per worker: rl_router_worker_*_tokens_total).",
      policy, [pool] {
        const auto [prompt, cached] = PrefixTotals(pool->List());
        return Ratio(cached, prompt);
      });
  m.SetGaugeCallback("rl_router_weight_version_mismatch",
                     "1 when live workers report different weight versions.", {},
                     [pool] { return pool->VersionMismatch() ? 1.0 : 0.0; });
}

void RouterMetrics::RecordPrefix(const std::string& worker, int64_t prompt, int64_t cached) {
  const Labels labels = {{"worker", worker}};
  registry_
      ->GetCounter(kWorkerPromptTokens,
                   "Prompt tokens of the completions a worker finished for this router.", labels)
      ->Inc(static_cast<double>(prompt));
  registry_
      ->GetCounter(kWorkerCachedTokens,
                   "Of those, the tokens the worker served from its prefix cache (its "
                   "cached_tokens).",
                   labels)
      ->Inc(static_cast<double>(cached));
}

void RouterMetrics::ForgetWorker(const std::string& worker) {
  registry_->RemoveSeries(kWorkerPromptTokens, "worker", worker);
  registry_->RemoveSeries(kWorkerCachedTokens, "worker", worker);
}

void RouterMetrics::Fill(rl::v1::GetMetricsResponse* out) const {
  const std::vector<rl::v1::WorkerStatus> workers = pool_->List();
  int32_t active = 0;
  int64_t in_flight_total = 0;
  for (const auto& w : workers) {
    if (w.state() == rl::v1::WORKER_STATE_LIVE && w.enabled()) ++active;
    in_flight_total += w.in_flight();
    *out->add_workers() = w;
  }
  out->set_active_workers(active);
  out->set_total_workers(static_cast<int32_t>(workers.size()));
  out->set_in_flight(in_flight_total);
  out->set_requests_total(static_cast<int64_t>(requests_total_->value()));
  out->set_retries_total(static_cast<int64_t>(retries_total_->value()));
  out->set_failures_total(static_cast<int64_t>(failures_total_->value()));
  out->set_weight_version_mismatch(pool_->VersionMismatch());
  const TextCacheStats s = cache_->GetStats();
  rl::v1::CacheMetrics* c = out->mutable_cache();
  c->set_entries(s.entries);
  c->set_hits(s.hits);
  c->set_misses(s.misses);
  c->set_hit_rate(s.hit_rate);
  c->set_size_tokens(s.size_tokens);
  c->set_size_bytes(s.size_bytes);
  c->set_gc_runs(s.gc_runs);
  c->set_gc_removed_tokens(s.gc_removed_tokens);
  c->set_current_weight_version(s.current_version);
  c->set_max_cache_size(s.max_cache_size);
  c->set_gc_threshold_k(s.gc_threshold_k);
  c->set_seam_continuations(seam_->seam_continuations.load());
  c->set_whole_text_fallbacks(seam_->whole_text_fallbacks.load());
  const RoutingStats stats = pool_->routing_stats();
  rl::v1::RoutingMetrics* r = out->mutable_routing();
  r->set_policy(pool_->policy_name());
  r->set_load_factor(pool_->policy_load_factor());
  r->set_load_slack(pool_->policy_load_slack());
  r->set_picks(stats.picks);
  r->set_keyed_picks(stats.keyed_picks);
  r->set_key_moves(stats.key_moves);
  const auto [prompt, cached] = PrefixTotals(workers);
  r->set_prompt_tokens(prompt);
  r->set_cached_prompt_tokens(cached);
  r->set_prefix_hit_rate(Ratio(cached, prompt));
  r->set_load_spread(pool_->LoadSpread());
  r->set_mean_load_spread(stats.mean_load_spread);
  if (cache_->store() != nullptr) {
    const CacheStoreStats st = cache_->store()->GetStats();
    c->set_durable(!st.failed);
    c->set_disk_bytes(st.disk_bytes);
    c->set_max_disk_bytes(st.max_disk_bytes);
    c->set_store_commits(st.commits);
  }
  c->set_history_unknown_answers(static_cast<int64_t>(history_unknown_total_->value()));
  out->set_prometheus_text(registry_->RenderPrometheus());
}

}  // namespace rl::router
