#include "kernels/cpu/embedding.h"

namespace rl::kernels::cpu {

void Embedding(const EmbeddingParams& p, ThreadPool* /*pool*/) {
  const int64_t row_bytes = p.dim * model_io::DTypeSize(p.table_dtype);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    model_io::ConvertToF32(p.table_dtype,
                           static_cast<const uint8_t*>(p.table) + p.ids[t] * row_bytes, p.dim,
                           p.out + t * p.dim);
  }
}

}  // namespace rl::kernels::cpu
