// The CUDA Backend (cuda_runner.h has the design) and the device helpers.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/gpu/gpu_status.h"
#include "common/status.h"
#include "kernels/cuda/ops.h"
#include "services/worker/model/cuda_runner.h"
#include "spdlog/spdlog.h"

namespace rl::model {
namespace {

namespace kg = kernels::cuda;
using model_io::DType;

// For calls that cannot report (destructors, deleters): the failure is logged, not lost.
void LogIfError(const absl::Status& s) {
  if (!s.ok()) spdlog::error("{}", s.ToString());
}

// Binds `device` to the calling thread once (cudaSetDevice is per thread, and the engine thread
// is not the one that created the runner).
absl::Status BindDevice(int device) {
  thread_local int bound = -1;
  if (bound == device) return absl::OkStatus();
  RETURN_IF_ERROR(RL_GPU_STATUS(cudaSetDevice(device)));
  bound = device;
  return absl::OkStatus();
}

// Attention partials are computed for at most this many floats of workspace at a time; longer
// batches run in token ranges (each token is independent, so the result is the same).
constexpr int64_t kAttentionWorkspaceFloats = int64_t{16} << 20;  // 64 MiB
constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;

cudaDataType_t CudaType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options) {
    const int count = NumCudaDevices();
    if (count == 0) {
      return absl::FailedPreconditionError("cuda backend: no CUDA device is visible");
    }
    if (options.device < 0 || options.device >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda backend: device ", options.device, " is outside [0, ", count, ")"));
    }
    std::unique_ptr<CudaBackend> b(new CudaBackend(options));
    RETURN_IF_ERROR(BindDevice(b->device_));
    RETURN_IF_ERROR(RL_GPU_STATUS(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking)));
    RETURN_IF_ERROR(RL_GPU_STATUS(cublasCreate(&b->cublas_)));
    RETURN_IF_ERROR(RL_GPU_STATUS(cublasSetStream(b->cublas_, b->stream_)));
    // Full float32 for F32 GEMMs (no TF32), so they agree with the CPU oracle to rounding.
    RETURN_IF_ERROR(RL_GPU_STATUS(cublasSetMathMode(b->cublas_, CUBLAS_DEFAULT_MATH)));
    // A workspace of our own: cuBLAS then never allocates, which graph capture requires.
    ASSIGN_OR_RETURN(b->cublas_ws_, b->Allocate(kCublasWorkspaceBytes));
    RETURN_IF_ERROR(
        RL_GPU_STATUS(cublasSetWorkspace(b->cublas_, b->cublas_ws_.data(), kCublasWorkspaceBytes)));
    return b;
  }

  ~CudaBackend() override {
    // Buffers handed out by Allocate are freed by their own deleters (cudaFree).
    DropGraphs();
    cast_ws_ = DeviceBuffer();
    attn_ws_ = DeviceBuffer();
    if (cublas_ != nullptr) LogIfError(RL_GPU_STATUS(cublasDestroy(cublas_)));
    cublas_ws_ = DeviceBuffer();
    if (stream_ != nullptr) LogIfError(RL_GPU_STATUS(cudaStreamDestroy(stream_)));
  }

  std::string name() const override { return "cuda"; }
  int num_threads() const override { return 1; }

  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("allocate: negative size");
    RETURN_IF_ERROR(BindDevice(device_));
    void* p = nullptr;
    RETURN_IF_ERROR(
        RL_GPU_STATUS(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)))));
    return DeviceBuffer(p, bytes, [](void* q) { LogIfError(RL_GPU_STATUS(cudaFree(q))); });
  }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return absl::OkStatus();
    RETURN_IF_ERROR(BindDevice(device_));
    // Pageable source: the call returns once `src` has been staged, so it may be reused.
    return RL_GPU_STATUS(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
  }
  absl::Status CopyOnDevice(void* dst, const void* src, int64_t bytes) override {
    if (bytes <= 0) return absl::OkStatus();
    RETURN_IF_ERROR(BindDevice(device_));
    // On the compute stream: ordered after the forward passes queued before it.
    return RL_GPU_STATUS(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_));
  }
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    RETURN_IF_ERROR(BindDevice(device_));
    if (bytes > 0) {
      RETURN_IF_ERROR(RL_GPU_STATUS(
          cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_)));
    }
    return RL_GPU_STATUS(cudaStreamSynchronize(stream_));
  }

  absl::Status Embedding(const kernels::EmbeddingParams& p) override {
    RETURN_IF_ERROR(p.ValidateShapes());
    return RL_GPU_STATUS(kg::LaunchEmbedding(p, stream_));
  }
  absl::Status RmsNorm(const kernels::RmsNormParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    return RL_GPU_STATUS(kg::LaunchRmsNorm(p, nullptr, stream_));
  }
  absl::Status AddRmsNorm(const float* delta, const kernels::RmsNormParams& p) override {
    if (delta == nullptr) return absl::InvalidArgumentError("add_rmsnorm: null delta");
    RETURN_IF_ERROR(p.Validate());
    return RL_GPU_STATUS(kg::LaunchRmsNorm(p, delta, stream_));
  }
  absl::Status Rope(const kernels::RopeParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    return RL_GPU_STATUS(kg::LaunchRope(p, stream_));
  }
  absl::Status WriteKv(const kernels::WriteKvParams& p) override {
    RETURN_IF_ERROR(p.ValidateShapes());
    return RL_GPU_STATUS(kg::LaunchWriteKv(p, stream_));
  }
  absl::Status SiluMul(const kernels::SiluMulParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    return RL_GPU_STATUS(kg::LaunchSiluMul(p, stream_));
  }
  absl::Status AddInPlace(const float* x, float* y, int64_t n) override {
    if (x == nullptr || y == nullptr || n < 0) return absl::InvalidArgumentError("add: bad args");
    return RL_GPU_STATUS(kg::LaunchAddInPlace(x, y, n, stream_));
  }
  absl::Status GatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim,
                          float* out) override {
    if (x == nullptr || rows == nullptr || out == nullptr || num_rows < 0 || dim <= 0) {
      return absl::InvalidArgumentError("gather_rows: bad args");
    }
    return RL_GPU_STATUS(kg::LaunchGatherRows(x, rows, num_rows, dim, out, stream_));
  }

  absl::Status Attention(const kernels::AttentionParams& p) override {
    RETURN_IF_ERROR(p.ValidateShapes());
    if (p.num_tokens == 0) return absl::OkStatus();
    const int64_t max_ctx = p.batch_max_context > 0 ? p.batch_max_context : p.max_context;
    const int64_t per_token = kg::AttentionWorkspaceFloats(1, p.num_heads, p.head_dim, max_ctx);
    const int64_t tokens_per_launch =
        std::clamp<int64_t>(kAttentionWorkspaceFloats / per_token, 1, p.num_tokens);
    RETURN_IF_ERROR(Reserve(&attn_ws_, tokens_per_launch * per_token * 4));
    for (int64_t t0 = 0; t0 < p.num_tokens; t0 += tokens_per_launch) {
      const int64_t t1 = std::min(p.num_tokens, t0 + tokens_per_launch);
      RETURN_IF_ERROR(
          RL_GPU_STATUS(kg::LaunchAttention(p, t0, t1, max_ctx, attn_ws_.f32(), stream_)));
    }
    return absl::OkStatus();
  }

  bool supports_graphs() const override { return true; }
  absl::Status BeginGraphCapture() override {
    RETURN_IF_ERROR(BindDevice(device_));
    RETURN_IF_ERROR(
        RL_GPU_STATUS(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal)));
    capturing_ = true;
    return absl::OkStatus();
  }
  absl::StatusOr<int> EndGraphCapture(absl::Status recorded) override {
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    absl::Status st = RL_GPU_STATUS(cudaStreamEndCapture(stream_, &graph));
    if (st.ok()) st = recorded;
    cudaGraphExec_t exec = nullptr;
    if (st.ok()) st = RL_GPU_STATUS(cudaGraphInstantiate(&exec, graph, 0));
    if (graph != nullptr) LogIfError(RL_GPU_STATUS(cudaGraphDestroy(graph)));
    if (!st.ok()) {
      spdlog::warn("CUDA graph capture failed; decoding eagerly from now on: {}", st.ToString());
      return st;
    }
    graphs_[next_graph_] = exec;
    return next_graph_++;
  }
  absl::Status ReplayGraph(int graph) override {
    auto it = graphs_.find(graph);
    if (it == graphs_.end()) return absl::NotFoundError(absl::StrCat("graph ", graph, " dropped"));
    RETURN_IF_ERROR(BindDevice(device_));
    return RL_GPU_STATUS(cudaGraphLaunch(it->second, stream_));
  }
  void DropGraphs() override {
    for (auto& [id, exec] : graphs_) LogIfError(RL_GPU_STATUS(cudaGraphExecDestroy(exec)));
    graphs_.clear();
  }

  absl::Status MoeRoute(const kernels::MoeRouteParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    return RL_GPU_STATUS(kg::LaunchMoeRoute(p, stream_));
  }
  // Grouped per expert like the CPU kernel: the routing comes to the host (one sync per MoE
  // layer; MoE models never run under graphs), each expert's rows are gathered and run through
  // Matmul (cuBLAS, or the invariant kernel), and the weighted outputs are added to y expert by
  // expert in ascending id, so each token sums its experts in the CPU oracle's order.
  absl::Status MoeExperts(const kernels::MoeExpertsParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    const int64_t n = p.num_tokens;
    const int64_t nk = n * p.top_k;
    RETURN_IF_ERROR(BindDevice(device_));
    RETURN_IF_ERROR(RL_GPU_STATUS(
        cudaMemsetAsync(p.y, 0, static_cast<size_t>(n * p.hidden) * sizeof(float), stream_)));
    if (n == 0) return absl::OkStatus();
    std::vector<int32_t> ids(static_cast<size_t>(nk));
    std::vector<float> weights(static_cast<size_t>(nk));
    RETURN_IF_ERROR(CopyToHost(ids.data(), p.ids, nk * 4));
    RETURN_IF_ERROR(CopyToHost(weights.data(), p.weights, nk * 4));
    std::vector<int64_t> begin(static_cast<size_t>(p.num_experts + 1), 0);
    for (int32_t id : ids) {
      if (id < 0 || id >= p.num_experts) {
        return absl::InvalidArgumentError(
            absl::StrCat("moe_experts: expert id ", id, " out of range [0, ", p.num_experts, ")"));
      }
      ++begin[static_cast<size_t>(id + 1)];
    }
    int64_t max_rows = 0;
    for (int64_t e = 0; e < p.num_experts; ++e) {
      max_rows = std::max(max_rows, begin[static_cast<size_t>(e + 1)]);
      begin[static_cast<size_t>(e + 1)] += begin[static_cast<size_t>(e)];
    }
    std::vector<int32_t> rows(static_cast<size_t>(nk));
    std::vector<float> row_weights(static_cast<size_t>(nk));
    std::vector<int64_t> fill(begin.begin(), begin.end() - 1);
    for (int64_t i = 0; i < nk; ++i) {
      const size_t at =
          static_cast<size_t>(fill[static_cast<size_t>(ids[static_cast<size_t>(i)])]++);
      rows[at] = static_cast<int32_t>(i / p.top_k);
      row_weights[at] = weights[static_cast<size_t>(i)];
    }
    RETURN_IF_ERROR(Reserve(&moe_rows_, nk * 4));
    RETURN_IF_ERROR(Reserve(&moe_weights_, nk * 4));
    RETURN_IF_ERROR(Reserve(&moe_x_, max_rows * p.hidden * 4));
    RETURN_IF_ERROR(Reserve(&moe_gate_, max_rows * p.intermediate * 4));
    RETURN_IF_ERROR(Reserve(&moe_up_, max_rows * p.intermediate * 4));
    RETURN_IF_ERROR(Reserve(&moe_out_, max_rows * p.hidden * 4));
    RETURN_IF_ERROR(CopyToDevice(moe_rows_.data(), rows.data(), nk * 4));
    RETURN_IF_ERROR(CopyToDevice(moe_weights_.data(), row_weights.data(), nk * 4));
    for (int64_t e = 0; e < p.num_experts; ++e) {
      const int64_t b = begin[static_cast<size_t>(e)];
      const int64_t m = begin[static_cast<size_t>(e + 1)] - b;
      if (m == 0) continue;
      RETURN_IF_ERROR(GatherRows(p.x, moe_rows_.i32() + b, m, p.hidden, moe_x_.f32()));
      kernels::MatmulParams mm;
      mm.x = moe_x_.f32();
      mm.w = p.gate[e];
      mm.w_dtype = p.w_dtype;
      mm.y = moe_gate_.f32();
      mm.m = m;
      mm.n = p.intermediate;
      mm.k = p.hidden;
      RETURN_IF_ERROR(Matmul(mm));
      mm.w = p.up[e];
      mm.y = moe_up_.f32();
      RETURN_IF_ERROR(Matmul(mm));
      kernels::SiluMulParams act;
      act.gate = moe_gate_.f32();
      act.up = moe_up_.f32();
      act.out = moe_gate_.f32();
      act.n = m * p.intermediate;
      RETURN_IF_ERROR(SiluMul(act));
      mm.x = moe_gate_.f32();
      mm.w = p.down[e];
      mm.y = moe_out_.f32();
      mm.n = p.hidden;
      mm.k = p.intermediate;
      RETURN_IF_ERROR(Matmul(mm));
      RETURN_IF_ERROR(RL_GPU_STATUS(kg::LaunchMoeCombine(
          moe_out_.f32(), moe_rows_.i32() + b, moe_weights_.f32() + b, m, p.hidden, p.y, stream_)));
    }
    return absl::OkStatus();
  }

  absl::Status Matmul(const kernels::MatmulParams& p) override {
    RETURN_IF_ERROR(p.Validate());
    if (p.m == 0) return absl::OkStatus();
    if (batch_invariant_) return RL_GPU_STATUS(kg::LaunchInvariantMatmul(p, stream_));
    // Row-major y[m,n] = x[m,k] · W[n,k]ᵀ is column-major yᵀ[n,m] = W · xᵀ: A = W read
    // transposed (lda k), B = xᵀ (ldb k), C = yᵀ (ldc n).
    const float alpha = 1.0f;
    const float beta = 0.0f;
    const void* x = p.x;
    if (p.w_dtype != DType::kF32) {
      RETURN_IF_ERROR(Reserve(&cast_ws_, p.m * p.k * 2));
      RETURN_IF_ERROR(RL_GPU_STATUS(
          kg::LaunchCastFromF32(p.x, p.m * p.k, p.w_dtype, cast_ws_.data(), stream_)));
      x = cast_ws_.data();
    }
    const cudaDataType_t t = CudaType(p.w_dtype);
    RETURN_IF_ERROR(RL_GPU_STATUS(cublasGemmEx(
        cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(p.m),
        static_cast<int>(p.k), &alpha, p.w, t, static_cast<int>(p.k), x, t, static_cast<int>(p.k),
        &beta, p.y, CUDA_R_32F, static_cast<int>(p.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)));
    if (p.bias != nullptr) {
      RETURN_IF_ERROR(
          RL_GPU_STATUS(kg::LaunchAddBias(p.bias, p.bias_dtype, p.m, p.n, p.y, stream_)));
    }
    return absl::OkStatus();
  }

 private:
  explicit CudaBackend(const CudaBackendOptions& options)
      : device_(options.device), batch_invariant_(options.batch_invariant) {}

  // Grows a workspace; the old one is freed only after the queued work that may use it, and the
  // graphs that recorded its address are dropped. Never while capturing.
  absl::Status Reserve(DeviceBuffer* buffer, int64_t bytes) {
    if (buffer->data() != nullptr && buffer->bytes() >= bytes) return absl::OkStatus();
    if (capturing_) {
      return absl::FailedPreconditionError("a workspace would grow during graph capture");
    }
    DropGraphs();
    const int64_t grown = std::max<int64_t>(bytes, buffer->bytes() * 3 / 2);
    RETURN_IF_ERROR(RL_GPU_STATUS(cudaStreamSynchronize(stream_)));
    *buffer = DeviceBuffer();
    ASSIGN_OR_RETURN(*buffer, Allocate(grown));
    return absl::OkStatus();
  }

  const int device_;
  const bool batch_invariant_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer cast_ws_;
  // MoeExperts: sorted rows and weights, gathered activations and expert intermediates.
  DeviceBuffer moe_rows_, moe_weights_, moe_x_, moe_gate_, moe_up_, moe_out_;
  DeviceBuffer attn_ws_;
  DeviceBuffer cublas_ws_;
  bool capturing_ = false;
  std::map<int, cudaGraphExec_t> graphs_;
  int next_graph_ = 0;
};

}  // namespace

bool CudaBackendBuilt() { return true; }

int NumCudaDevices() { return gpu::NumCudaDevices(); }

absl::StatusOr<std::string> DescribeCudaDevice(int device) {
  cudaDeviceProp prop{};
  RETURN_IF_ERROR(RL_GPU_STATUS(cudaGetDeviceProperties(&prop, device)));
  return absl::StrFormat("%s, sm_%d%d, %.1f GiB", prop.name, prop.major, prop.minor,
                         static_cast<double>(prop.totalGlobalMem) / (1 << 30));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b, CudaBackend::Create(options));
  return std::unique_ptr<Backend>(std::move(b));
}

absl::StatusOr<int64_t> CudaFreeMemory(int device) {
  RETURN_IF_ERROR(BindDevice(device));
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  RETURN_IF_ERROR(RL_GPU_STATUS(cudaMemGetInfo(&free_bytes, &total_bytes)));
  return static_cast<int64_t>(free_bytes);
}

absl::StatusOr<double> MeasureCudaCopyBandwidth(int device, int64_t bytes) {
  if (bytes <= 0) return absl::InvalidArgumentError("bytes must be positive");
  RETURN_IF_ERROR(BindDevice(device));
  void* a = nullptr;
  void* b = nullptr;
  RETURN_IF_ERROR(RL_GPU_STATUS(cudaMalloc(&a, static_cast<size_t>(bytes))));
  absl::Status st = RL_GPU_STATUS(cudaMalloc(&b, static_cast<size_t>(bytes)));
  double best = 0;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  if (st.ok()) st = RL_GPU_STATUS(cudaEventCreate(&start));
  if (st.ok()) st = RL_GPU_STATUS(cudaEventCreate(&stop));
  for (int i = 0; st.ok() && i < 5; ++i) {
    st = RL_GPU_STATUS(cudaEventRecord(start));
    if (st.ok())
      st = RL_GPU_STATUS(cudaMemcpy(b, a, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice));
    if (st.ok()) st = RL_GPU_STATUS(cudaEventRecord(stop));
    if (st.ok()) st = RL_GPU_STATUS(cudaEventSynchronize(stop));
    float ms = 0;
    if (st.ok()) st = RL_GPU_STATUS(cudaEventElapsedTime(&ms, start, stop));
    // A copy reads and writes every byte.
    if (st.ok() && i > 0 && ms > 0) best = std::max(best, 2.0 * bytes / (ms * 1e-3));
  }
  if (start != nullptr) LogIfError(RL_GPU_STATUS(cudaEventDestroy(start)));
  if (stop != nullptr) LogIfError(RL_GPU_STATUS(cudaEventDestroy(stop)));
  LogIfError(RL_GPU_STATUS(cudaFree(a)));
  if (b != nullptr) LogIfError(RL_GPU_STATUS(cudaFree(b)));
  if (!st.ok()) return st;
  return best;
}

}  // namespace rl::model
