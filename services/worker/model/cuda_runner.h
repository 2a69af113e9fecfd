// The CUDA backend and model runner: the production path on NVIDIA GPUs (sm_80, sm_90a).
//
// CudaBackend implements Backend with the kernels in kernels/cuda and cuBLAS GEMMs on one
// stream: F32 weights through SGEMM (no TF32), BF16/F16 weights with the activations rounded to
// the weight dtype and float32 accumulation and output. In batch-invariant mode every GEMM runs
// our own tiled kernel whose per-element reduction order does not depend on the batch, so a
// row's logits are bit-identical whatever else is in the batch (the other ops are invariant by
// construction).
//
// CudaModelRunner keeps the checkpoint in owned host memory (ListWeights, VisitWeights,
// checksums) and a device mirror in the stored dtype, optionally with an FP32 LM head. The KV
// cache (bf16 by default, float32 on request; attention accumulates in float32) takes
// `kv_cache_bytes`, or, when that is 0, `gpu_memory_fraction` of the
// device memory left free after the weights. Destroying the runner frees all of its device
// memory (ReleaseMemory drops the runner; ResumeMemory re-reads the weights and re-allocates).
// Weight updates are validated on the host first, then copied into the mirror in place. A
// staged version (read ahead into host memory) is uploaded while serving into a second device
// copy when the free device memory holds it (StageOnDevice, model/staged_mirror.h: the memory
// left after the KV cache, so a lower --gpu-memory-fraction leaves room); its activation is then
// one device-to-device copy into the mirror, else one host-to-device copy (logged).
//
// Code: the backend and the device helpers in cuda_backend.cc, the runner in cuda_runner.cc.
// In a build without CUDA every factory here answers FAILED_PRECONDITION and NumCudaDevices()
// is 0, so callers need no #ifdefs.
// Thread safety: as ModelRunner (one thread at a time; the device is bound per calling thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/worker/model/backend.h"
#include "services/worker/model/model_runner.h"
#include "services/worker/model/runner_options.h"

namespace rl::model {

struct CudaBackendOptions {
  int device = 0;
  bool batch_invariant = false;
};

// True when this binary was built with the CUDA backend.
bool CudaBackendBuilt();
// CUDA devices visible to this process (0 without a driver, a device or a CUDA build).
int NumCudaDevices();
// "NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB" for `device`, or why it cannot be described.
absl::StatusOr<std::string> DescribeCudaDevice(int device);

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options);
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaModelRunner(const RunnerOptions& options);

// Free memory of `device` in bytes (cudaMemGetInfo).
absl::StatusOr<int64_t> CudaFreeMemory(int device);

// Device-to-device copy bandwidth in bytes/s (copies of `bytes`, best of a few), for the
// benchmarks' memory-bandwidth bound.
absl::StatusOr<double> MeasureCudaCopyBandwidth(int device, int64_t bytes);

}  // namespace rl::model
