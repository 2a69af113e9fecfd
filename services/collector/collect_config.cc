#include "services/collector/collect_config.h"

#include <string>

#include "services/collector/prompt_set.h"

namespace rl::collector {

absl::Status ValidateConfig(const CollectConfig& c) {
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError(m); };
  if (c.out.empty()) return bad("--out is required");
  if (!c.merge_only) {
    if (c.router.empty()) return bad("--router is required");
    if (c.prompts.empty()) return bad("--prompts is required");
  }
  if (c.n < 1 || c.n > kMaxSamplesPerPrompt) return bad("--n must be in [1, 1024]");
  if (c.concurrency < 1 || c.concurrency > 4096) return bad("--concurrency must be in [1, 4096]");
  if (c.save_batch_size < 1 || c.save_batch_size > 10'000'000) {
    return bad("--save-batch-size must be in [1, 10000000]");
  }
  if (c.max_new_tokens < 0) return bad("--max-new-tokens must be >= 0");
  if (!(c.temperature >= 0) || c.temperature > 100) return bad("--temperature must be in [0, 100]");
  if (!(c.top_p > 0) || c.top_p > 1) return bad("--top-p must be in (0, 1]");
  if (c.idle_flush_ms < 1) return bad("--idle-flush-ms must be >= 1");
  if (c.max_attempts < 1 || c.max_attempts > 100) return bad("--max-attempts must be in [1, 100]");
  if (c.retry_backoff_ms < 0 || c.max_backoff_ms < c.retry_backoff_ms) {
    return bad("--retry-backoff-ms must be >= 0 and <= --max-backoff-ms");
  }
  if (c.request_timeout_s < 1) return bad("--request-timeout-s must be >= 1");
  if (c.channels < 1 || c.channels > 64) return bad("--channels must be in [1, 64]");
  if (c.progress != "auto" && c.progress != "bar" && c.progress != "log" && c.progress != "off") {
    return bad("--progress must be auto, bar, log or off");
  }
  if (c.batch_groups < 0 || c.batch_groups > 10'000'000) {
    return bad("--batch-groups must be in [0, 10000000] (0: no batches, every row)");
  }
  if (!(c.over_sample >= 1) || c.over_sample > 16) return bad("--over-sample must be in [1, 16]");
  if (c.batch_groups == 0 && (c.over_sample != 1 || !c.group_filter.empty())) {
    return bad("--over-sample and --group-filter need --batch-groups (the batch to collect)");
  }
  if (c.batch_groups > 0 && c.return_routed_experts) {
    return bad(
        "--batch-groups does not keep routed experts across runs yet: drop one of "
        "--batch-groups and --return-routed-experts");
  }
  return absl::OkStatus();
}

}  // namespace rl::collector
