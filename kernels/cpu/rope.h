// CPU RoPE over the params of kernels/rope.h: rotates q and k in place.
// Cost: O(num_tokens · (num_heads + num_kv_heads) · head_dim), parallel over tokens.
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/rope.h"

namespace rl::kernels::cpu {

// Run after p.Validate().
void Rope(const RopeParams& p, ThreadPool* pool);

}  // namespace rl::kernels::cpu
