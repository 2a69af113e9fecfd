// rl-collect: streams a JSONL prompt set through rl-router into an output folder of shards,
// checkpoints, resumes (the same command) and merges into DIR/trajectories.safetensors.
// Flags are read here only, into a validated CollectConfig.
//
// Exit status: 0 everything collected and merged; 3 merged, but some samples failed (rerun the
// same command to retry them); 130 interrupted (SIGINT/SIGTERM: finished samples are saved, a
// second signal exits at once); 2 bad flags or prompt set; 1 any other error.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "common/flags.h"
#include "common/server_main.h"
#include "services/collector/collect_config.h"
#include "services/collector/collector.h"

int main(int argc, char** argv) {
  rl::collector::CollectConfig c;
  std::string log_level = "info";
  rl::FlagSet flags("rl-collect");
  flags.String("router", &c.router, "rl-router address HOST:PORT");
  flags.String("prompts", &c.prompts, "JSONL prompt set (index, text | input_ids, ...)");
  flags.String("out", &c.out, "output folder (shards, checkpoint.json, trajectories.safetensors)");
  flags.Int("n", &c.n, "samples per prompt (one group per prompt)");
  flags.Int("concurrency", &c.concurrency, "requests in flight at once");
  flags.Int("save-batch-size", &c.save_batch_size, "samples per shard");
  flags.Int("max-new-tokens", &c.max_new_tokens, "default max_new_tokens");
  flags.Double("temperature", &c.temperature, "default temperature (0 greedy)");
  flags.Double("top-p", &c.top_p, "default top_p");
  flags.Int("seed", &c.seed, "base sampling seed (per-sample seeds derive from it); -1 unset");
  flags.Bool("merge", &c.merge_only, "only merge the saved shards (no generation)");
  flags.String("api-key", &c.api_key, "bearer key for the router (or env RL_API_KEY)");
  flags.Int("idle-flush-ms", &c.idle_flush_ms, "write a shard after this long without results");
  flags.Int("max-attempts", &c.max_attempts, "attempts per sample before it is recorded failed");
  flags.Int("retry-backoff-ms", &c.retry_backoff_ms, "first retry backoff, doubled per retry");
  flags.Int("max-backoff-ms", &c.max_backoff_ms, "retry backoff cap");
  flags.Int("request-timeout-s", &c.request_timeout_s, "deadline of one generation call");
  flags.Int("channels", &c.channels, "gRPC connections to the router");
  flags.Bool("jsonl", &c.jsonl, "also write a JSONL twin of every shard (debugging)");
  flags.Bool("return-routed-experts", &c.return_routed_experts,
             "MoE: store every sample's routed experts and weights (R3) in the shards (the "
             "workers need --enable-return-routed-experts)");
  flags.String("progress", &c.progress, "auto|bar|log|off (auto: a bar on a terminal)");
  flags.Int("batch-groups", &c.batch_groups,
            "collect a batch of this many groups (prompt rows with their --n samples) per run, "
            "then merge what is saved; the next run collects the next batch (0: every row)");
  flags.Double("over-sample", &c.over_sample,
               "with --batch-groups: submit ceil(F x batch) groups, keep the first batch that "
               "complete (and pass --group-filter), abort the rest through the router and keep "
               "their partial samples in the checkpoint for the next run to resume");
  flags.String("group-filter", &c.group_filter,
               "with --batch-groups: a shell command that reads a completed group as JSON on "
               "stdin and prints keep or drop (e.g. examples/group_filters/dapo_filter.py)");
  rl::MainOptions options{.program = "rl-collect", .flags = &flags, .log_level = &log_level};
  options.validate = [&c] { return rl::collector::ValidateConfig(c); };
  if (std::optional<int> exit_code = rl::PrepareMain(argc, argv, options)) return *exit_code;
  if (c.api_key.empty()) {
    if (const char* k = std::getenv("RL_API_KEY")) c.api_key = k;
  }
  const std::atomic<bool>* stop = rl::StopOnTerminationSignal();
  auto summary = rl::collector::RunCollect(c, stop);
  if (!summary.ok()) {
    std::cerr << "rl-collect: " << summary.status().message() << "\n";
    return absl::IsInvalidArgument(summary.status()) ? 2 : 1;
  }
  if (summary->interrupted) {
    std::cerr << "rl-collect: interrupted; finished samples are saved, run the same command to "
                 "resume\n";
    return 130;
  }
  std::printf("collected %ld/%ld samples (%ld failed) -> %s/trajectories.safetensors\n",
              static_cast<long>(summary->done), static_cast<long>(summary->total),
              static_cast<long>(summary->failed), c.out.c_str());
  if (c.batch_groups > 0) {
    std::printf(
        "batch: %ld groups kept, %ld dropped by the filter, %ld aborted (%ld samples "
        "saved for the next run), %ld samples resumed\n",
        static_cast<long>(summary->kept_groups), static_cast<long>(summary->dropped_groups),
        static_cast<long>(summary->aborted_groups), static_cast<long>(summary->partials_saved),
        static_cast<long>(summary->resumed));
  }
  return summary->failed > 0 ? 3 : 0;
}
