// Backend: the ops a transformer forward needs, behind one interface so the model definition
// (transformer.h) is shared by every device. The CPU backend runs the kernels in kernels/cpu;
// a CUDA backend implements the same methods with its own kernels and cuBLAS.
//
// Buffers: every pointer in the params structs is backend memory (host memory for the CPU,
// device memory for CUDA), obtained from Allocate(); host data crosses with CopyToDevice /
// CopyToHost. Weight pointers come from the backend's view of the Weights (for the CPU the
// host tensors the process owns). Params structs are plain, backend-neutral descriptions
// (kernels/<op>.h document every buffer's shape); each op validates them and returns
// InvalidArgument instead of running on bad input. Device backends check shapes and pointers
// only (the data is on the device): the Transformer validates ids, slots and positions on the
// host before any op runs.
// Ordering: ops run in call order; CopyToHost returns once the data is on the host.
// Thread safety: a backend is used by one thread at a time (the runner's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"

namespace rl::model {

// A block of backend memory, freed with the backend's deleter.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(void* data, int64_t bytes, void (*deleter)(void*))
      : data_(data, deleter), bytes_(bytes) {}
  void* data() const { return data_.get(); }
  float* f32() const { return static_cast<float*>(data_.get()); }
  int32_t* i32() const { return static_cast<int32_t*>(data_.get()); }
  int64_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<void, void (*)(void*)> data_{nullptr, [](void*) {}};
  int64_t bytes_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual int num_threads() const = 0;

  // Uninitialised memory (the OS commits host pages on first touch).
  virtual absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) = 0;
  // A layer's K or V cache: allocated once, when the model is set up, and read by every decode
  // step. A backend may place it where that pays (the CPU's in 2 MiB pages); by default Allocate.
  virtual absl::StatusOr<DeviceBuffer> AllocateKvCache(int64_t bytes) { return Allocate(bytes); }
  // Host → backend; `src` may be reused as soon as the call returns.
  virtual absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) = 0;
  // Backend → host, after every op queued before it has finished.
  virtual absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) = 0;
  // Backend → backend, ordered after every op queued before it (a staged device copy of the
  // weights copied into the served one: staged_mirror.h).
  virtual absl::Status CopyOnDevice(void* dst, const void* src, int64_t bytes) {
    return absl::UnimplementedError(absl::StrCat("CopyOnDevice on backend ", name()));
  }

  virtual absl::Status Embedding(const kernels::EmbeddingParams& p) = 0;
  virtual absl::Status RmsNorm(const kernels::RmsNormParams& p) = 0;
  virtual absl::Status Matmul(const kernels::MatmulParams& p) = 0;
  // Matmuls with the same m and x (fused QKV, gate/up), each element bit-identical to Matmul.
  // The default runs them one by one; the CPU backend runs them as one parallel region.
  virtual absl::Status MatmulGroup(absl::Span<const kernels::MatmulParams> group) {
    for (const kernels::MatmulParams& p : group) {
      if (absl::Status s = Matmul(p); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  virtual absl::Status Rope(const kernels::RopeParams& p) = 0;
  virtual absl::Status WriteKv(const kernels::WriteKvParams& p) = 0;
  virtual absl::Status Attention(const kernels::AttentionParams& p) = 0;
  virtual absl::Status SiluMul(const kernels::SiluMulParams& p) = 0;
  // y[i] += x[i] for i < n (the residual connection).
  virtual absl::Status AddInPlace(const float* x, float* y, int64_t n) = 0;
  // The residual add fused with the next norm: p.x += delta (rows · dim floats), then
  // p.y = RmsNorm(p.x). The default runs AddInPlace then RmsNorm (bit-identical to the two
  // calls); device backends fuse it into one pass.
  virtual absl::Status AddRmsNorm(const float* delta, const kernels::RmsNormParams& p) {
    absl::Status s = AddInPlace(delta, const_cast<float*>(p.x), p.rows * p.dim);
    if (!s.ok()) return s;
    return RmsNorm(p);
  }
  // Mixture of experts (kernels/moe.h). The routing ids and weights are backend memory;
  // MoeExpertsParams' gate/up/down are host arrays of backend pointers. Backends without MoE
  // support answer UNIMPLEMENTED.
  virtual absl::Status MoeRoute(const kernels::MoeRouteParams& /*p*/) {
    return absl::UnimplementedError(absl::StrCat(name(), " backend: mixture of experts"));
  }
  virtual absl::Status MoeExperts(const kernels::MoeExpertsParams& /*p*/) {
    return absl::UnimplementedError(absl::StrCat(name(), " backend: mixture of experts"));
  }
  // out[r] = x[rows[r]] for r < num_rows, rows of `dim` floats.
  virtual absl::Status GatherRows(const float* x, const int32_t* rows, int64_t num_rows,
                                  int64_t dim, float* out) = 0;

  // ---- Graphs (device backends; the defaults say "not supported") ----
  // Between BeginGraphCapture and EndGraphCapture the ops are recorded instead of run; nothing
  // may allocate or copy to the host meanwhile. EndGraphCapture(status of the recorded work)
  // ends the recording and returns a handle for ReplayGraph, or the error (the recording is
  // discarded). DropGraphs frees every graph (their buffers moved); a backend also drops them
  // itself when one of its workspaces has to move.
  virtual bool supports_graphs() const { return false; }
  virtual absl::Status BeginGraphCapture() { return absl::UnimplementedError("graph capture"); }
  virtual absl::StatusOr<int> EndGraphCapture(absl::Status recorded) {
    return recorded.ok() ? absl::UnimplementedError("graph capture") : recorded;
  }
  // NotFound when `graph` was dropped (the caller captures again).
  virtual absl::Status ReplayGraph(int /*graph*/) {
    return absl::UnimplementedError("graph replay");
  }
  virtual void DropGraphs() {}
};

// The CPU backend with `num_threads` threads (0: hardware concurrency).
std::unique_ptr<Backend> CreateCpuBackend(int num_threads);
// With `bf16_products`, matmuls of BF16 weights round x to bf16 and add bf16 products
// (kernels/cpu/matmul_bf16.h: faster, not exact); FAILED_PRECONDITION without AVX512-BF16.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(int num_threads, bool bf16_products);

}  // namespace rl::model
