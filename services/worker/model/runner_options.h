// RunnerOptions: how to build a ModelRunner, for every backend (CpuModelRunner,
// CreateCudaModelRunner). Fields a backend does not use are ignored by it; those marked
// "CUDA runner only" change nothing on the CPU.
#pragma once

#include <cstdint>
#include <string>

namespace rl::model {

struct RunnerOptions {
  std::string model_dir;
  int32_t page_size = 16;
  // KV cache size: num_kv_slots when > 0, else kv_cache_bytes / bytes per slot; rounded down to
  // whole pages.
  int64_t num_kv_slots = 0;
  int64_t kv_cache_bytes = int64_t{256} << 20;
  int num_threads = 0;  // 0: hardware concurrency
  // CUDA runner only (cuda_runner.h): the device, the share of its free memory (after the
  // weights) the KV cache takes when kv_cache_bytes is 0, the batch-invariant GEMMs, an FP32
  // copy of a 16-bit LM head, and CUDA graphs for decode.
  int cuda_device = 0;
  double gpu_memory_fraction = 0.85;
  bool batch_invariant = false;
  bool fp32_lm_head = false;
  // MoE router (gate) GEMM in float32: on CUDA an FP32 copy of a 16-bit gate; the CPU backend
  // always widens weights to float32, so it changes nothing there.
  bool fp32_router = false;
  bool cuda_graphs = true;  // capture decode steps in CUDA graphs (transformer.h)
  // KV cache element type: "auto" (float32 on the CPU, bfloat16 on CUDA), "float32", or
  // "bfloat16" (CUDA only).
  std::string kv_cache_dtype = "auto";
  // After the startup load, reserve spare read buffers of the checkpoint's size
  // (Weights::ReserveUpdateBuffers): the first UpdateWeightsFromDisk is then as fast as later
  // ones, at the cost of a second copy of the weights in host memory (reclaimable only with
  // model_io::SetSpareBuffersReclaimable).
  bool reserve_update_buffers = true;
  // CPU runner only: matmuls of BF16 weights round the activations to bf16 and add bf16 products
  // with AVX512-BF16 (like a bf16 trainer's matmul): faster prefill, NOT exact (the README's
  // performance section gives the measured logprob difference); still batch-invariant. Off by
  // default; refused on a CPU without AVX512-BF16.
  bool cpu_bf16_products = false;
  // CPU runner only: move the served weights into 2 MiB pages in the background after every
  // load or swap (cpu_huge_pages.h; batch-1 decode ~10% faster on Zen 5), and allocate the KV
  // cache in them (CpuBackendOptions::huge_page_kv_cache; decode attention 8-10%). On by default.
  bool cpu_huge_pages = true;
  // CPU runner only: time every op per shape (CpuModelRunner::op_profile; runner_bench
  // --op-profile). Costs two clock reads per op.
  bool cpu_op_profile = false;
};

}  // namespace rl::model
