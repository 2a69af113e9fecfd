#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/silu_mul.h"

namespace rl::kernels::cpu {

void MoeRoute(const MoeRouteParams& p) {
  const int64_t e = p.num_experts;
  const int64_t k = p.top_k;
  std::vector<float> prob(static_cast<size_t>(e));
  std::vector<std::pair<double, int64_t>> queue(static_cast<size_t>(e));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const float* row = p.logits + t * e;
    // Softmax in float32: max, exp(x - max), sum in index order, times 1 / sum.
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < e; ++i) max = std::max(max, row[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < e; ++i) {
      prob[static_cast<size_t>(i)] = std::exp(row[i] - max);
      sum += prob[static_cast<size_t>(i)];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < e; ++i) prob[static_cast<size_t>(i)] *= inv;
    // Top-k exactly as torch.topk(largest, sorted) on the CPU (ATen's topk_impl_loop): the
    // same (value, index) queue, comparator and standard algorithms, so equal weights come out
    // in the same order torch gives them.
    for (int64_t i = 0; i < e; ++i) {
      queue[static_cast<size_t>(i)] = {static_cast<double>(prob[static_cast<size_t>(i)]), i};
    }
    const auto greater = [](const std::pair<double, int64_t>& x,
                            const std::pair<double, int64_t>& y) {
      return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
    };
    if (k * 64 <= e) {
      std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), greater);
    } else {
      std::nth_element(queue.begin(), queue.begin() + k - 1, queue.end(), greater);
      std::sort(queue.begin(), queue.begin() + k - 1, greater);
    }
    int32_t* ids = p.ids + t * k;
    float* w = p.weights + t * k;
    float top_sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      ids[j] = static_cast<int32_t>(queue[static_cast<size_t>(j)].second);
      w[j] = prob[static_cast<size_t>(ids[j])];
      top_sum += w[j];
    }
    if (p.norm_topk_prob) {
      for (int64_t j = 0; j < k; ++j) w[j] /= top_sum;
    }
  }
}

absl::Status MoeExperts(const MoeExpertsParams& p, ThreadPool* pool, MoeScratch* s) {
  const int64_t n = p.num_tokens;
  const int64_t k = p.top_k;
  const int64_t hidden = p.hidden;
  const int64_t inter = p.intermediate;
  for (int64_t i = 0; i < n * k; ++i) {
    if (p.ids[i] < 0 || p.ids[i] >= p.num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("moe_experts: expert id ", p.ids[i],
                                                     " out of range [0, ", p.num_experts, ")"));
    }
  }
  // Counting sort of the (token, slot) pairs by expert, tokens ascending within an expert.
  s->begin.assign(static_cast<size_t>(p.num_experts + 1), 0);
  for (int64_t i = 0; i < n * k; ++i) ++s->begin[static_cast<size_t>(p.ids[i] + 1)];
  for (int64_t e = 0; e < p.num_experts; ++e) {
    s->begin[static_cast<size_t>(e + 1)] += s->begin[static_cast<size_t>(e)];
  }
  s->rows.resize(static_cast<size_t>(n * k));
  s->slots.resize(static_cast<size_t>(n * k));
  std::vector<int64_t> fill(s->begin.begin(), s->begin.end() - 1);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const size_t at = static_cast<size_t>(fill[static_cast<size_t>(p.ids[t * k + j])]++);
      s->rows[at] = static_cast<int32_t>(t);
      s->slots[at] = static_cast<int32_t>(j);
    }
  }
  int64_t max_rows = 0;
  for (int64_t e = 0; e < p.num_experts; ++e) {
    max_rows =
        std::max(max_rows, s->begin[static_cast<size_t>(e + 1)] - s->begin[static_cast<size_t>(e)]);
  }
  s->x.resize(static_cast<size_t>(max_rows * hidden));
  s->gate.resize(static_cast<size_t>(max_rows * inter));
  s->up.resize(static_cast<size_t>(max_rows * inter));
  s->out.resize(static_cast<size_t>(max_rows * hidden));

  std::fill(p.y, p.y + n * hidden, 0.0f);
  for (int64_t e = 0; e < p.num_experts; ++e) {
    const int64_t b = s->begin[static_cast<size_t>(e)];
    const int64_t m = s->begin[static_cast<size_t>(e + 1)] - b;
    if (m == 0) continue;
    for (int64_t r = 0; r < m; ++r) {
      const float* src = p.x + static_cast<int64_t>(s->rows[static_cast<size_t>(b + r)]) * hidden;
      std::copy(src, src + hidden, s->x.data() + r * hidden);
    }
    MatmulParams mm;
    mm.x = s->x.data();
    mm.w = p.gate[e];
    mm.w_dtype = p.w_dtype;
    mm.y = s->gate.data();
    mm.m = m;
    mm.n = inter;
    mm.k = hidden;
    Matmul(mm, pool);
    mm.w = p.up[e];
    mm.y = s->up.data();
    Matmul(mm, pool);
    SiluMulParams act;
    act.gate = s->gate.data();
    act.up = s->up.data();
    act.out = s->gate.data();
    act.n = m * inter;
    SiluMul(act, pool);
    mm.x = s->gate.data();
    mm.w = p.down[e];
    mm.y = s->out.data();
    mm.n = hidden;
    mm.k = inter;
    Matmul(mm, pool);
    // Experts run in ascending id, so each token sums its experts in ascending id.
    for (int64_t r = 0; r < m; ++r) {
      const int64_t t = s->rows[static_cast<size_t>(b + r)];
      const float w = p.weights[t * k + s->slots[static_cast<size_t>(b + r)]];
      const float* o = s->out.data() + r * hidden;
      float* dst = p.y + t * hidden;
      for (int64_t i = 0; i < hidden; ++i) dst[i] += o[i] * w;
    }
  }
  return absl::OkStatus();
}

}  // namespace rl::kernels::cpu
