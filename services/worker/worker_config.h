// WorkerConfig: everything rl-worker is started with, built from flags in main.cc and validated
// once; nothing below main reads flags.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/request_limits.h"

namespace rl::worker {

inline constexpr size_t kMaxModelAliasBytes = 256;

struct WorkerConfig {
  std::string model_path;
  std::string host = "127.0.0.1";
  int port = 0;
  std::string backend = "auto";    // auto | cpu | cuda
  std::string admin_api_key;       // empty: admin calls need no key
  std::string api_key;             // optional separate data-plane key
  std::string admin_api_key_file;  // read the admin key from this file (a mounted Secret)
  std::string api_key_file;        // read the data-plane key from this file
  RequestLimits limits;            // --max-* bounds on what a client may send
  int metrics_port = -1;           // -1: no metrics endpoint; 0: any free port
  int page_size = 16;
  double kv_cache_gb = 0;  // 0: auto (0.25 GiB on cpu; gpu_memory_fraction on cuda)
  int cuda_device = 0;
  double gpu_memory_fraction = 0.85;  // cuda: share of free memory after the weights for KV
  bool batch_invariant = false;       // cuda: batch-invariant GEMMs
  bool fp32_lm_head = false;          // cuda: FP32 copy of a 16-bit LM head
  bool fp32_router = false;           // MoE: router GEMM in float32 (FP32 copy of a 16-bit gate)
  bool enable_return_routed_experts = false;  // MoE: allow return_routed_experts (R3)
  // The fork's alignment switch: "" | xorl | xorl-batch-invariant. xorl turns on fp32_lm_head
  // and fp32_router; xorl-batch-invariant also batch_invariant (ApplyOnPolicyTarget).
  std::string rl_on_policy_target;
  bool disable_cuda_graph = false;          // cuda: decode eagerly instead of replaying graphs
  bool no_update_buffers = false;           // no spare read buffers reserved at startup
  bool reclaimable_update_buffers = false;  // spare read buffers marked MADV_FREE
  bool allow_non_finite_weights = false;    // load checkpoints holding NaN / Inf
  int staging_nice = 10;  // a disk stage's read runs this much nicer than the engine (0..19)
  bool cpu_bf16_products = false;       // RunnerOptions::cpu_bf16_products (not exact; off)
  bool cpu_huge_pages = true;           // RunnerOptions::cpu_huge_pages
  std::string kv_cache_dtype = "auto";  // auto | float32 | bfloat16 (cuda only)
  int num_threads = 0;                  // 0: all cores
  int max_running_requests = 256;
  int chunked_prefill_tokens = 2048;
  int64_t weight_version = 0;
  // Staleness bound for requests that set no max_version_lag (-1: none).
  int max_version_lag = -1;
  std::string log_level = "info";
  // SGLang's scheduler protocol (the SMG gateway). The served model name reported to SGLang
  // clients ("": model_path).
  std::string model_alias;
  // A listener of its own for that protocol, without the keys (SMG sends none): -1 off (served
  // on --port only, behind the keys); 0 any free port. sglang_host "": --host.
  int sglang_port = -1;
  std::string sglang_host;
  // How long an SGLang request may wait on a paused worker before UNAVAILABLE (PauseGuard).
  double sglang_pause_timeout_s = 60;
  // SIGTERM: how long the requests running or waiting may take to finish before the rest are
  // aborted with their partial outputs (WorkerServer::Drain). The chart's
  // terminationGracePeriodSeconds is larger.
  double drain_grace_s = 30;
};

// InvalidArgument naming the first bad flag.
absl::Status Validate(const WorkerConfig& config);
// Turns on the flags --rl-on-policy-target stands for; returns a line saying which (empty when
// the target is unset). Call after Validate.
std::string ApplyOnPolicyTarget(WorkerConfig* config);

}  // namespace rl::worker
