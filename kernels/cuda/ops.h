// CUDA launchers, one op per .cu file, taking the backend-neutral params structs
// (kernels/<op>.h document every buffer's shape) with device pointers, and an explicit stream.
// Launchers check nothing the params' buffer-free checks check (ValidateShapes(), or Validate()
// where it reads no buffer: the backend calls them first) and return the launch's cudaError_t
// (cudaErrorInvalidValue for an unsupported dtype), which the caller turns into a Status with
// RL_GPU_STATUS. Work is only queued: nothing synchronizes.
//
// Numerics: float32 activations and accumulation; weights read in their stored dtype. Every
// reduction has a fixed order that depends only on the row (sizes), never on the batch, so
// these kernels are batch-invariant; the attention's split size is a constant for that reason.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/model_io/dtype.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"

namespace rl::kernels::cuda {

// embedding.cu
cudaError_t LaunchEmbedding(const EmbeddingParams& p, cudaStream_t stream);

// rmsnorm.cu: p.y = RmsNorm(p.x); with `delta` non-null, first p.x += delta (the residual add
// fused in: one read of x and delta, one write of x and y). y may alias x or delta.
cudaError_t LaunchRmsNorm(const RmsNormParams& p, const float* delta, cudaStream_t stream);

// rope.cu
cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream);

// kv_write.cu
cudaError_t LaunchWriteKv(const WriteKvParams& p, cudaStream_t stream);

// attention.cu: paged attention for a mixed batch (prefill chunks with a cached prefix, decode
// tokens) as flash-decoding: each (token, KV head) is cut into splits of kAttentionSplit positions
// computed in parallel for every query head of the group (scores, max, exp-sum and the weighted
// V sum per split, K/V read once per group), then merged in
// split order. `batch_max_context` is the largest context_len of the batch (sizes the grid).
// Workspace: AttentionWorkspaceFloats(...) floats for the tokens [token_begin, token_end).
inline constexpr int kAttentionSplit = 256;
int64_t AttentionWorkspaceFloats(int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                                 int64_t batch_max_context);
cudaError_t LaunchAttention(const AttentionParams& p, int64_t token_begin, int64_t token_end,
                            int64_t batch_max_context, float* workspace, cudaStream_t stream);

// moe.cu: the router's softmax and top-k, one thread per token (float32; equal weights: the
// lower expert id first, which can differ from torch.topk's order on exact ties), and the
// combine of one expert's rows: y[rows[r]] += weights[r] · out[r] (rows distinct per call).
cudaError_t LaunchMoeRoute(const MoeRouteParams& p, cudaStream_t stream);
cudaError_t LaunchMoeCombine(const float* out, const int32_t* rows, const float* weights,
                             int64_t num_rows, int64_t dim, float* y, cudaStream_t stream);

// silu_mul.cu
cudaError_t LaunchSiluMul(const SiluMulParams& p, cudaStream_t stream);

// elementwise.cu
// y[i] += x[i]
cudaError_t LaunchAddInPlace(const float* x, float* y, int64_t n, cudaStream_t stream);
// out[r] = x[rows[r]], rows of `dim` floats
cudaError_t LaunchGatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim,
                             float* out, cudaStream_t stream);
// dst[i] = src[i] rounded (nearest even) to `dtype` (F32, BF16 or F16): the activations of the
// cuBLAS 16-bit path.

cudaError_t LaunchCastFromF32(const float* src, int64_t n, model_io::DType dtype, void* dst,
                              cudaStream_t stream);
// dst[i] = float(src[i]) from `dtype`: the FP32 LM head's widened copy.
cudaError_t LaunchCastToF32(const void* src, model_io::DType dtype, int64_t n, float* dst,
                            cudaStream_t stream);
// y[r, j] += bias[j] for r < m, j < n
cudaError_t LaunchAddBias(const void* bias, model_io::DType dtype, int64_t m, int64_t n, float* y,
                          cudaStream_t stream);

// matmul.cu: y = x · Wᵀ (+ bias) with our own tiled kernel. Every y[i][j] is one sequential FMA
// chain over k in index order, whatever m, the tile or the block: bit-identical across batch
// sizes (the batch-invariant mode's GEMM; cuBLAS picks algorithms by shape and is not).
cudaError_t LaunchInvariantMatmul(const MatmulParams& p, cudaStream_t stream);

}  // namespace rl::kernels::cuda
