// CPU paged attention and KV write over the params of kernels/attention.h (buffers' shapes, the
// KV layout and the numerics contract are documented there). The CPU KV cache is float32.
//
// Batch invariance: every (token, head) row runs the same operations in the same order as if
// computed alone — its scores (SIMD dot products reduced by one fixed lane tree, several
// positions at once), the max, Highway's vectorized exp, the sum, and the weighted V sum in
// position order — so its result does not depend on the rest of the batch. Rows that share a
// sequence and a KV head are attended in tiles of up to 8 (each K/V row read once per tile),
// bit-identical to one by one; a prefill chunk's tiles first gather their KV head's K/V rows
// into contiguous per-thread buffers (the cache's head slices map to few L2 sets).
// Cost: O(Σ_t context_len[t] · num_heads · head_dim); parallel over tasks of 32 query rows of
// one KV head (KV head outermost), K/V prefetched 8 positions ahead.
#pragma once

#include "absl/status/status.h"
#include "kernels/attention.h"
#include "kernels/cpu/thread_pool.h"

namespace rl::kernels::cpu {

// The CPU kernel's checks: p.ValidateShapes(), a float32 KV cache, then p.Validate() (every
// slot; host memory).
absl::Status ValidateWriteKv(const WriteKvParams& p);
void WriteKv(const WriteKvParams& p);

// The CPU kernel's checks: p.ValidateShapes(), a workspace, a float32 KV cache, then
// p.Validate() (every context range and slot, O(Σ context_len)). The caller also provides at
// least pool->num_threads() workspaces.
absl::Status ValidateAttention(const AttentionParams& p);
void Attention(const AttentionParams& p, ThreadPool* pool);

}  // namespace rl::kernels::cpu
