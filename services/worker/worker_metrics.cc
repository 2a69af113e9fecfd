#include "services/worker/worker_metrics.h"

#include <utility>

namespace rl::worker {

WorkerMetrics::WorkerMetrics(engine::Engine* engine, std::function<bool()> asleep) {
  MetricsRegistry& m = registry_;
  requests_total_ = m.GetCounter("rl_worker_requests_total", "Generate completions finished.");
  aborted_total_ = m.GetCounter("rl_worker_aborted_total", "Completions finished by abort.");
  prompt_tokens_total_ = m.GetCounter("rl_worker_prompt_tokens_total", "Prompt tokens processed.");
  generated_tokens_total_ =
      m.GetCounter("rl_worker_generated_tokens_total", "Tokens generated (rate() = tokens/s).");
  cached_tokens_total_ =
      m.GetCounter("rl_worker_cached_tokens_total", "Prompt tokens served from the prefix cache.");
  const auto latency = ExponentialBuckets(0.001, 2, 16);
  ttft_seconds_ =
      m.GetHistogram("rl_worker_time_to_first_token_seconds", "Time to first token.", latency);
  per_token_seconds_ = m.GetHistogram("rl_worker_time_per_output_token_seconds",
                                      "Mean decode time per output token of a request.", latency);
  e2e_seconds_ =
      m.GetHistogram("rl_worker_request_duration_seconds", "Submission to finish.", latency);
  update_seconds_ = m.GetHistogram("rl_worker_weight_update_duration_seconds",
                                   "Duration of weight updates.", latency);
  m.SetGaugeCallback("rl_worker_running_requests", "Requests in the running batch.", {},
                     [engine] { return engine->GetServerInfo().scheduler.num_running; });
  m.SetGaugeCallback("rl_worker_waiting_requests", "Requests in the waiting queue.", {},
                     [engine] { return engine->GetServerInfo().scheduler.num_waiting; });
  m.SetGaugeCallback("rl_worker_kv_usage_ratio", "Fraction of KV tokens in use.", {}, [engine] {
    const engine::ServerInfo i = engine->GetServerInfo();
    return i.scheduler.total_kv_tokens > 0
               ? 1.0 - static_cast<double>(i.scheduler.available_kv_tokens) /
                           i.scheduler.total_kv_tokens
               : 0.0;
  });
  m.SetGaugeCallback(
      "rl_worker_cache_hit_ratio", "Prompt tokens served from the prefix cache.", {}, [engine] {
        const engine::ServerInfo i = engine->GetServerInfo();
        return i.scheduler.prompt_tokens > 0
                   ? static_cast<double>(i.scheduler.cache_hit_tokens) / i.scheduler.prompt_tokens
                   : 0.0;
      });
  m.SetGaugeCallback("rl_worker_weight_version", "Version of the served weights.", {},
                     [engine] { return static_cast<double>(engine->weight_version()); });
  m.SetGaugeCallback("rl_worker_paused", "1 while generation is paused.", {},
                     [engine] { return engine->GetServerInfo().paused ? 1.0 : 0.0; });
  m.SetGaugeCallback("rl_worker_asleep", "1 while memory is released.", {},
                     [asleep = std::move(asleep)] { return asleep() ? 1.0 : 0.0; });
}

void WorkerMetrics::RecordFinished(const engine::GenerateResult& r) {
  requests_total_->Inc();
  if (r.finish_reason.kind == engine::FinishKind::kAbort) aborted_total_->Inc();
  prompt_tokens_total_->Inc(r.prompt_tokens);
  generated_tokens_total_->Inc(r.completion_tokens);
  cached_tokens_total_->Inc(r.cached_tokens);
  if (r.timings.ttft_us > 0) ttft_seconds_->Observe(r.timings.ttft_us / 1e6);
  e2e_seconds_->Observe(r.timings.total_us / 1e6);
  if (r.completion_tokens > 1 && r.timings.ttft_us > 0) {
    per_token_seconds_->Observe((r.timings.total_us - r.timings.ttft_us) / 1e6 /
                                (r.completion_tokens - 1));
  }
}

}  // namespace rl::worker
