// attention_bench: the CPU paged-attention kernel alone, on the attention of a 0.5B-class Llama
// (16 query heads, 8 KV heads of 128, float32 KV cache): a causal prefill of --tokens tokens in
// one chunk (token t attends positions [0, t]), and a decode step of --batch sequences each at
// --context positions. Each layer has its own KV cache (--layers of them), so K/V come from
// memory as in a forward pass, not from a cache-warm buffer.
//
//   attention_bench [--threads N] [--tokens 512] [--batch 16] [--context 512] [--layers 4]
//                   [--reps 5] [--wall] [--huge-pages=true|false]
//
// Times are process CPU time by default (robust on a shared machine; use --threads 1 with it,
// as spinning pool workers also count) or wall-clock time with --wall. Prints the best of
// --reps passes over every layer: ms per layer and GFLOP/s (2 · 2 · head_dim FLOPs per
// (query head, position): the QKᵀ and PV products).
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "common/flags.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"

namespace {

namespace kc = rl::kernels::cpu;

double Now(bool wall) {
  timespec ts;
  clock_gettime(wall ? CLOCK_MONOTONIC : CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

constexpr int64_t kHeads = 16, kKvHeads = 8, kHeadDim = 128;
// The checkpoint's max_position_embeddings: the runner sizes each thread's score workspace by
// it, which lets a tile hold 8 rows of long contexts.
constexpr int64_t kMaxContext = 40960;

// A KV cache as the CPU runner has it: 64-byte aligned (CpuBackend::Allocate; std::vector's
// 16-byte alignment splits every vector load of a K/V row over two cache lines, which made decode
// 25% slower here than in the runner), in 2 MiB pages with `huge_pages` (the runner collapses
// its KV cache into them; MADV_HUGEPAGE here, before the pages are first written).
class KvBuffer {
 public:
  KvBuffer(int64_t floats, bool huge_pages) : floats_(floats) {
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + kHuge - 1) / kHuge * kHuge;
    data_ = static_cast<float*>(std::aligned_alloc(kHuge, bytes));
    if (data_ == nullptr) {
      std::fprintf(stderr, "attention_bench: cannot allocate %zu bytes\n", bytes);
      std::exit(1);
    }
    if (huge_pages) madvise(data_, bytes, MADV_HUGEPAGE);  // best effort: a refusal only slows
  }
  ~KvBuffer() { std::free(data_); }
  KvBuffer(const KvBuffer&) = delete;
  KvBuffer& operator=(const KvBuffer&) = delete;
  absl::Span<float> span() { return absl::MakeSpan(data_, static_cast<size_t>(floats_)); }

 private:
  int64_t floats_;
  float* data_;
};

// One case: the tokens' context lengths and slot offsets over `num_seqs` sequences of
// `seq_len` slots each (sequence s owns slots [s · seq_len, (s + 1) · seq_len)).
struct Case {
  const char* name;
  std::vector<int32_t> context_len, slot_begin, slots;
  int64_t max_context = 0;
};

// Best time over reps of one attention call per layer, and the FLOPs of one call.
void Run(const Case& c, int layers, int reps, bool wall, bool huge_pages, kc::ThreadPool& pool,
         int threads) {
  const int64_t t = static_cast<int64_t>(c.context_len.size());
  const int64_t num_slots = static_cast<int64_t>(c.slots.size());
  const int64_t kv = num_slots * kKvHeads * kHeadDim;
  KvBuffer k_buffer(kv * layers, huge_pages), v_buffer(kv * layers, huge_pages);
  const absl::Span<float> k_cache = k_buffer.span(), v_cache = v_buffer.span();
  for (size_t i = 0; i < k_cache.size(); ++i) {
    k_cache[i] = std::sin(0.001f * static_cast<float>(i % 100003));
    v_cache[i] = std::cos(0.002f * static_cast<float>(i % 100019));
  }
  std::vector<float> q(static_cast<size_t>(t * kHeads * kHeadDim));
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.003f * static_cast<float>(i % 7919));
  std::vector<float> out(q.size());
  std::vector<float> ws(static_cast<size_t>(threads * c.max_context));
  rl::kernels::AttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.context_len = c.context_len.data();
  p.slot_begin = c.slot_begin.data();
  p.slots = c.slots.data();
  p.workspace = ws.data();
  p.num_workspaces = threads;
  p.num_tokens = t;
  p.num_heads = kHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kHeadDim;
  p.q_stride = kHeads * kHeadDim;
  p.num_slots = num_slots;
  p.num_slot_entries = num_slots;
  p.max_context = c.max_context;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  p.k_cache = k_cache.data();
  p.v_cache = v_cache.data();
  if (absl::Status s = kc::ValidateAttention(p); !s.ok()) {
    std::fprintf(stderr, "attention_bench: %s\n", s.ToString().c_str());
    return;
  }
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const double t0 = Now(wall);
    for (int l = 0; l < layers; ++l) {
      p.k_cache = k_cache.data() + l * kv;
      p.v_cache = v_cache.data() + l * kv;
      kc::Attention(p, &pool);
    }
    best = std::min(best, (Now(wall) - t0) / layers);
  }
  double positions = 0;
  for (int32_t len : c.context_len) positions += len;
  const double flops = 4.0 * kHeadDim * kHeads * positions;
  std::printf("%-28s %8.3f ms per layer, %6.1f GFLOP/s\n", c.name, 1e3 * best, flops / best / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, tokens = 512, batch = 16, context = 512, layers = 4, reps = 5;
  bool wall = false;
  bool huge_pages = true;
  rl::FlagSet flags("attention_bench");
  flags.Int("threads", &threads, "pool threads");
  flags.Int("tokens", &tokens, "prompt tokens of the prefill case");
  flags.Int("batch", &batch, "sequences of the decode case");
  flags.Int("context", &context, "positions each decode sequence attends");
  flags.Int("layers", &layers, "layers (separate KV caches) per pass");
  flags.Int("reps", &reps, "passes; the best is printed");
  flags.Bool("wall", &wall, "wall-clock instead of process CPU time");
  flags.Bool("huge-pages", &huge_pages,
             "the KV caches in 2 MiB pages (MADV_HUGEPAGE), as the runner's");
  if (std::optional<int> exit = flags.ParseMain(argc, argv)) return *exit;
  if (threads < 1 || threads > 256 || tokens < 1 || tokens > 32768 || batch < 1 || batch > 1024 ||
      context < 1 || context > 32768 || layers < 1 || layers > 64 || reps < 1 || reps > 100) {
    std::fprintf(stderr,
                 "attention_bench: --threads in [1, 256], --tokens and --context in [1, 32768], "
                 "--batch in [1, 1024], --layers in [1, 64], --reps in [1, 100]\n");
    return 2;
  }
  kc::ThreadPool pool(threads);
  std::printf("attention_bench: %d threads, %d heads / %d KV heads of %d, %s time\n", threads,
              static_cast<int>(kHeads), static_cast<int>(kKvHeads), static_cast<int>(kHeadDim),
              wall ? "wall-clock" : "CPU");
  Case prefill{"prefill"};
  for (int32_t i = 0; i < tokens; ++i) {
    prefill.context_len.push_back(i + 1);
    prefill.slot_begin.push_back(0);
    prefill.slots.push_back(i);
  }
  prefill.max_context = kMaxContext;
  Case decode{"decode"};
  for (int32_t s = 0; s < batch; ++s) {
    decode.context_len.push_back(context);
    decode.slot_begin.push_back(s * context);
    for (int32_t j = 0; j < context; ++j) decode.slots.push_back(s * context + j);
  }
  decode.max_context = kMaxContext;
  char prefill_name[64], decode_name[64];
  std::snprintf(prefill_name, sizeof(prefill_name), "prefill %d tokens", tokens);
  std::snprintf(decode_name, sizeof(decode_name), "decode %d x %d positions", batch, context);
  prefill.name = prefill_name;
  decode.name = decode_name;
  Run(prefill, layers, reps, wall, huge_pages, pool, threads);
  Run(decode, layers, reps, wall, huge_pages, pool, threads);
  return 0;
}
