#include "services/worker/worker_config.h"

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace rl::worker {

absl::Status Validate(const WorkerConfig& c) {
  const auto bad = [](const char* flag, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", why));
  };
  if (c.model_path.empty()) return bad("model", "required (a Hugging Face model folder)");
  std::error_code ec;
  if (!std::filesystem::is_directory(c.model_path, ec)) {
    return bad("model", absl::StrCat("'", c.model_path, "' is not a folder"));
  }
  if (c.port < 0 || c.port > 65535) return bad("port", "must be in [0, 65535]");
  if (c.model_alias.size() > kMaxModelAliasBytes) {
    return bad("model-alias", absl::StrCat("longer than ", kMaxModelAliasBytes, " bytes"));
  }
  for (char ch : c.model_alias) {
    if (ch <= ' ' || ch > '~') {
      return bad("model-alias", "must be printable ASCII without spaces");
    }
  }
  if (c.sglang_port < -1 || c.sglang_port > 65535) {
    return bad("sglang-port", "must be -1 (off) or in [0, 65535]");
  }
  if (c.sglang_port >= 0 && c.port != 0 && c.sglang_port == c.port &&
      (c.sglang_host.empty() || c.sglang_host == c.host)) {
    return bad("sglang-port", "must differ from --port");
  }
  if (!c.sglang_host.empty() && c.sglang_port < 0) {
    return bad("sglang-host", "needs --sglang-port");
  }
  if (!(c.sglang_pause_timeout_s >= 0 && c.sglang_pause_timeout_s <= 86400)) {
    return bad("sglang-pause-timeout-s", "must be in [0, 86400]");
  }
  if (!(c.drain_grace_s >= 0 && c.drain_grace_s <= 86400)) {
    return bad("drain-grace-s", "must be in [0, 86400]");
  }
  if (c.metrics_port < -1 || c.metrics_port > 65535) {
    return bad("metrics-port", "must be -1 (off) or in [0, 65535]");
  }
  if (c.backend != "auto" && c.backend != "cpu" && c.backend != "cuda") {
    return bad("backend", absl::StrCat("'", c.backend, "' is not auto, cpu or cuda"));
  }
  if (c.page_size < 1 || c.page_size > 1024 || (c.page_size & (c.page_size - 1)) != 0) {
    return bad("page-size", "must be a power of two in [1, 1024]");
  }
  if (!(c.kv_cache_gb >= 0) || c.kv_cache_gb > 4096) {
    return bad("kv-cache-gb", "must be in [0, 4096] (0: auto)");
  }
  if (c.cuda_device < 0 || c.cuda_device > 1023) return bad("cuda-device", "must be in [0, 1023]");
  if (c.kv_cache_dtype != "auto" && c.kv_cache_dtype != "float32" &&
      c.kv_cache_dtype != "bfloat16") {
    return bad("kv-cache-dtype",
               absl::StrCat("'", c.kv_cache_dtype, "' is not auto, float32 or bfloat16"));
  }
  if (!(c.gpu_memory_fraction > 0 && c.gpu_memory_fraction < 1)) {
    return bad("gpu-memory-fraction", "must be in (0, 1)");
  }
  if (c.num_threads < 0 || c.num_threads > 1024) return bad("threads", "must be in [0, 1024]");
  if (c.max_running_requests < 1) return bad("max-running-requests", "must be >= 1");
  if (c.chunked_prefill_tokens < 16) return bad("chunked-prefill-tokens", "must be >= 16");
  if (c.weight_version < 0) return bad("weight-version", "must be >= 0");
  if (c.max_version_lag < -1) return bad("max-version-lag", "must be >= 0, or -1 for none");
  if (!c.rl_on_policy_target.empty() && c.rl_on_policy_target != "xorl" &&
      c.rl_on_policy_target != "xorl-batch-invariant") {
    return bad("rl-on-policy-target",
               absl::StrCat("'", c.rl_on_policy_target, "' is not xorl or xorl-batch-invariant"));
  }
  if (c.staging_nice < 0 || c.staging_nice > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("--staging-nice: must be in [0, 19], got ", c.staging_nice));
  }
  if (absl::Status s = ValidateRequestLimits(c.limits); !s.ok()) return s;
  return absl::OkStatus();
}

std::string ApplyOnPolicyTarget(WorkerConfig* c) {
  if (c->rl_on_policy_target.empty()) return "";
  c->fp32_lm_head = true;
  c->fp32_router = true;
  std::string line = absl::StrCat("--rl-on-policy-target ", c->rl_on_policy_target,
                                  ": FP32 LM head (--enable-fp32-lm-head), FP32 MoE router "
                                  "(--enable-fp32-router)");
  if (c->rl_on_policy_target == "xorl-batch-invariant") {
    c->batch_invariant = true;
    absl::StrAppend(&line, ", batch-invariant mode (--batch-invariant)");
  }
  absl::StrAppend(&line, "; the CPU backend is FP32 and batch-invariant in any case");
  return line;
}

}  // namespace rl::worker
