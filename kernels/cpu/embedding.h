// CPU embedding over the params of kernels/embedding.h: gathers rows of the table and widens
// them to float32. Run after p.Validate(). Cost: num_tokens · dim element conversions.
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/embedding.h"

namespace rl::kernels::cpu {

void Embedding(const EmbeddingParams& p, ThreadPool* pool);

}  // namespace rl::kernels::cpu
