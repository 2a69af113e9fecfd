// rl-worker: one model replica serving rl.v1.Worker and rl.v1.Admin over gRPC.
// Flags are read here only, turned into a WorkerConfig and validated.
#include "common/auth.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/model_io/file_read.h"
#include "common/model_io/safetensors.h"
#include "common/request_limits.h"
#include "common/server_main.h"
#include "services/worker/worker_server.h"

int main(int argc, char** argv) {
  rl::worker::WorkerConfig config;
  rl::FlagSet flags("rl-worker");
  flags.String("model", &config.model_path,
               "Hugging Face model folder (config.json, *.safetensors)");
  flags.String("model-alias", &config.model_alias,
               "model name reported to SGLang clients such as the SMG gateway (GetModelInfo "
               "served_model_name; default: the --model path)");
  flags.String("host", &config.host, "address to bind");
  flags.Int("port", &config.port, "gRPC port (0 picks a free one)");
  flags.String("backend", &config.backend, "auto | cpu | cuda");
  const rl::ServerKeyFlags keys = {&config.admin_api_key, &config.admin_api_key_file,
                                   &config.api_key, &config.api_key_file};
  rl::RegisterServerKeyFlags(flags, keys, "Worker calls");
  rl::RegisterRequestLimitFlags(flags, &config.limits);
  flags.Int("metrics-port", &config.metrics_port, "Prometheus HTTP port (-1 off, 0 any)");
  flags.Int("sglang-port", &config.sglang_port,
            "a second gRPC port serving only SGLang's scheduler protocol WITHOUT the API keys, "
            "for the SMG gateway (which sends none): bind it where only the gateway reaches "
            "(-1 off, 0 any)");
  flags.String("sglang-host", &config.sglang_host, "address --sglang-port binds (default: --host)");
  flags.Double("sglang-pause-timeout-s", &config.sglang_pause_timeout_s,
               "an SGLang request waits at most this long on a paused worker, then ends "
               "UNAVAILABLE (the gateway retries elsewhere); new ones are refused until it "
               "resumes");
  flags.Double("drain-grace-s", &config.drain_grace_s,
               "on SIGTERM: stop taking work, let what runs finish for up to this long, then "
               "abort the rest with their partial outputs");
  flags.Int("page-size", &config.page_size, "KV cache page size in tokens");
  flags.Double("kv-cache-gb", &config.kv_cache_gb,
               "KV cache budget in GiB (0: 0.25 on cpu, --gpu-memory-fraction on cuda)");
  flags.Int("cuda-device", &config.cuda_device, "CUDA device index (cuda backend)");
  flags.Double("gpu-memory-fraction", &config.gpu_memory_fraction,
               "share of the device memory free after the weights that the KV cache takes");
  flags.Bool("batch-invariant", &config.batch_invariant,
             "cuda: batch-invariant GEMMs (a row's logits do not depend on the batch)");
  flags.Bool("enable-fp32-lm-head", &config.fp32_lm_head,
             "cuda: keep an FP32 copy of a 16-bit LM head (float32 logits GEMM)");
  flags.Bool("enable-fp32-router", &config.fp32_router,
             "MoE: router (gate) GEMM in float32 (cuda: FP32 copy of a 16-bit gate; the CPU "
             "backend always is)");
  flags.Bool("enable-return-routed-experts", &config.enable_return_routed_experts,
             "MoE: allow requests to ask for the routed experts (R3) of every token");
  flags.String("rl-on-policy-target", &config.rl_on_policy_target,
               "xorl | xorl-batch-invariant: the fork's alignment set (FP32 LM head and router; "
               "-batch-invariant adds --batch-invariant)");
  flags.String("kv-cache-dtype", &config.kv_cache_dtype,
               "auto (cpu: float32, cuda: bfloat16) | float32 | bfloat16 (cuda only)");
  flags.Bool("no-reserve-update-buffers", &config.no_update_buffers,
             "do not reserve a spare copy of the checkpoint's read buffers at startup: less host "
             "memory, but the first UpdateWeightsFromDisk faults fresh pages in (about 2x slower "
             "than later ones)");
  flags.Bool("reclaimable-update-buffers", &config.reclaimable_update_buffers,
             "mark the spare read buffers MADV_FREE, so the kernel can reclaim that second copy "
             "of the checkpoint under memory pressure; refilling them makes each "
             "UpdateWeightsFromDisk about 2x slower");
  flags.Int("staging-nice", &config.staging_nice,
            "how much nicer than the engine a disk stage's read runs (StageWeights, the read of "
            "UpdateWeightsFromDisk; 0..19, 0: same priority), so decoding keeps its core while "
            "a version is read, hashed and verified");
  flags.Bool("allow-non-finite-weights", &config.allow_non_finite_weights,
             "load checkpoints and take tensor streams holding NaN or Inf weights (refused by "
             "default, at start-up, on every UpdateWeightsFromDisk and UpdateWeightsFromTensor, "
             "naming the tensor and the first bad element)");
  flags.Bool("cpu-bf16-products", &config.cpu_bf16_products,
             "cpu: matmuls of bf16 weights round activations to bf16 and add bf16 products "
             "(AVX512-BF16 vdpbf16ps, like a bf16 trainer): faster prefill, NOT exact (see the "
             "README's performance section for the logprob difference); off by default");
  flags.Bool("cpu-huge-pages", &config.cpu_huge_pages,
             "cpu: after every load or weight swap, move the served weights into 2 MiB pages "
             "on a background thread at nice 19 (MADV_COLLAPSE; decode streams them, and a TLB "
             "miss per 4 KiB page cost it ~10%), and allocate the KV cache in 2 MiB pages "
             "(MADV_HUGEPAGE); --cpu-huge-pages=false keeps 4 KiB pages");
  flags.Bool("disable-cuda-graph", &config.disable_cuda_graph,
             "cuda: run decode steps eagerly instead of replaying captured CUDA graphs");
  flags.Int("threads", &config.num_threads, "compute threads (0: all cores)");
  flags.Int("max-running-requests", &config.max_running_requests, "running batch limit");
  flags.Int("chunked-prefill-tokens", &config.chunked_prefill_tokens, "prefill tokens per step");
  flags.Int("weight-version", &config.weight_version, "initial weight version");
  flags.Int("max-version-lag", &config.max_version_lag,
            "staleness bound for requests that set no max_version_lag: a request the weight "
            "version moved more than this past its dispatch version ends with finish reason "
            "stale and its partial output (-1: none)");
  rl::MainOptions options{
      .program = "rl-worker", .flags = &flags, .log_level = &config.log_level, .keys = keys};
  auto start = [&] {
    rl::model_io::SetSpareBuffersReclaimable(config.reclaimable_update_buffers);
    rl::model_io::SetNonFiniteWeightsAllowed(config.allow_non_finite_weights);
    return rl::worker::WorkerServer::Start(config);
  };
  auto ready = [&](rl::worker::WorkerServer& server) {
    if (!server.sglang_address().empty()) rl::AnnounceListening(server.sglang_address(), "sglang");
    if (server.metrics_port() >= 0) {
      spdlog::info("metrics on http://{}:{}/metrics", config.host, server.metrics_port());
    }
  };
  return rl::RunServerMain(argc, argv, options, start, ready);
}
