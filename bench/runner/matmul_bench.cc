// matmul_bench: the CPU matmul kernels alone, on the linear layers of a 0.5B-class Llama
// (hidden 1024, intermediate 3072, 16 / 8 heads of 128; bf16 weights, laid out one after the
// other as in a checkpoint), against a read-only stream of the same buffer by the same threads.
//
//   matmul_bench [--threads N] [--rows 1,16,64] [--layers 28] [--reps 5] [--wall]
//                [--bf16-products] [--shapes N:K,...] [--huge-pages]
//
// Times are process CPU time by default (robust on a shared machine: another process running
// does not count; use --threads 1 with it, as spinning pool workers also count) or wall-clock
// time with --wall. Prints, per m (rows of x), the best of --reps passes over every layer:
// GB/s of weights streamed, GFLOP/s, and the matmul time as a share of the read time.
// --bf16-products runs the bf16-products kernels (kernels/cpu/matmul_bf16.h) instead; --shapes
// replaces the layer's seven (n, k) shapes, e.g. --shapes 1024:3072 for the down projection;
// --huge-pages puts the weights in 2 MiB pages (MADV_HUGEPAGE; the line "weights in huge pages"
// says how much of them the kernel gave), else they are in 4 KiB pages as the loader maps them.
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_ops.h"

namespace {

namespace kc = rl::kernels::cpu;

double Now(bool wall) {
  timespec ts;
  clock_gettime(wall ? CLOCK_MONOTONIC : CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Shape {
  int64_t n, k;
};

volatile uint64_t g_sink = 0;

// kB of AnonHugePages in this process (/proc/self/smaps_rollup), -1 when unreadable.
int64_t AnonHugeKb() {
  FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t kb = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long v = 0;
    if (std::sscanf(line, "AnonHugePages: %lld kB", &v) == 1) kb = v;
  }
  std::fclose(f);
  return kb;
}

// `bytes` of anonymous memory at a 2 MiB boundary, in 4 KiB pages (MADV_NOHUGEPAGE) or, with
// `huge`, in 2 MiB pages where the kernel has them (MADV_HUGEPAGE).
struct Mapping {
  Mapping(size_t size, bool huge) : bytes(size + (size_t{2} << 20)) {
    base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      base = nullptr;
      return;
    }
    const uintptr_t a = (reinterpret_cast<uintptr_t>(base) + (uintptr_t{2} << 20) - 1) &
                        ~((uintptr_t{2} << 20) - 1);
    data = reinterpret_cast<void*>(a);
    (void)::madvise(data, size, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  }
  ~Mapping() {
    if (base != nullptr) ::munmap(base, bytes);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  size_t bytes;
  void* base = nullptr;
  void* data = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, layers = 28, reps = 5;
  bool wall = false;
  bool bf16_products = false;
  bool huge_pages = false;
  std::string rows_flag = "1,16,64";
  std::string shapes_flag;
  rl::FlagSet flags("matmul_bench");
  flags.Int("threads", &threads, "pool threads");
  flags.String("rows", &rows_flag, "comma-separated m values (rows of x)");
  flags.Int("layers", &layers, "layers of weights (28: 840 MiB)");
  flags.Int("reps", &reps, "passes per m; the best is printed");
  flags.Bool("wall", &wall, "wall-clock instead of process CPU time");
  flags.Bool("bf16-products", &bf16_products, "the bf16-products kernels (not exact)");
  flags.String("shapes", &shapes_flag, "comma-separated N:K weight shapes (default: a layer's)");
  flags.Bool("huge-pages", &huge_pages, "weights in 2 MiB pages (MADV_HUGEPAGE)");
  if (std::optional<int> exit = flags.ParseMain(argc, argv)) return *exit;
  std::vector<int64_t> rows;
  for (absl::string_view part : absl::StrSplit(rows_flag, ',')) {
    int64_t m = 0;
    if (!absl::SimpleAtoi(part, &m) || m <= 0 || m > 4096) {
      std::fprintf(stderr, "matmul_bench: --rows: '%s' is not in [1, 4096]\n",
                   std::string(part).c_str());
      return 2;
    }
    rows.push_back(m);
  }
  if (threads < 1 || threads > 256 || layers < 1 || layers > 64 || reps < 1 || reps > 100) {
    std::fprintf(stderr,
                 "matmul_bench: --threads in [1, 256], --layers in [1, 64], --reps in "
                 "[1, 100]\n");
    return 2;
  }
  if (bf16_products && !kc::Bf16ProductsSupported()) {
    std::fprintf(stderr, "matmul_bench: --bf16-products: this CPU has no AVX512-BF16\n");
    return 2;
  }
  // q, k, v, o, gate, up, down of one layer.
  std::vector<Shape> layer = {{2048, 1024}, {1024, 1024}, {1024, 1024}, {1024, 2048},
                              {3072, 1024}, {3072, 1024}, {1024, 3072}};
  if (!shapes_flag.empty()) {
    layer.clear();
    for (absl::string_view part : absl::StrSplit(shapes_flag, ',')) {
      std::vector<absl::string_view> nk = absl::StrSplit(part, ':');
      Shape s{0, 0};
      if (nk.size() != 2 || !absl::SimpleAtoi(nk[0], &s.n) || !absl::SimpleAtoi(nk[1], &s.k) ||
          s.n <= 0 || s.k <= 0 || s.n > 65536 || s.k > 65536) {
        std::fprintf(stderr, "matmul_bench: --shapes: '%s' is not N:K in [1, 65536]\n",
                     std::string(part).c_str());
        return 2;
      }
      layer.push_back(s);
    }
  }
  int64_t max_k = 0;
  for (const Shape& s : layer) max_k = std::max(max_k, s.k);
  int64_t per_layer = 0;
  for (const Shape& s : layer) per_layer += s.n * s.k;
  const int64_t elems = per_layer * layers;
  const int64_t bytes = elems * 2;
  Mapping mapping(static_cast<size_t>(bytes), huge_pages);
  if (mapping.data == nullptr) {
    std::fprintf(stderr, "matmul_bench: cannot map %lld bytes\n", static_cast<long long>(bytes));
    return 1;
  }
  auto* w = static_cast<uint16_t*>(mapping.data);
  for (int64_t i = 0; i < elems; ++i) {  // bf16 values in [1, 2) of varied mantissas
    w[i] = static_cast<uint16_t>(0x3F80 + (i * 2654435761u >> 20) % 128);
  }
  const int64_t max_m = *std::max_element(rows.begin(), rows.end());
  int64_t max_n = 0;
  for (const Shape& s : layer) max_n = std::max(max_n, s.n);
  std::vector<float> x(static_cast<size_t>(max_m * max_k), 0.01f);
  std::vector<float> y(static_cast<size_t>(max_m * max_n));
  kc::ThreadPool pool(threads);
  const kc::KernelPlan& plan = kc::GetKernelPlan();
  std::printf("cpu: %s\nkernels: %s\n", kc::GetCpuInfo().Describe().c_str(),
              plan.Describe().c_str());
  std::printf("matmul_bench: %d threads, %d layers, %.0f MiB bf16 weights, %s time%s\n", threads,
              layers, static_cast<double>(bytes) / (1 << 20), wall ? "wall-clock" : "CPU",
              bf16_products ? ", bf16 products" : "");
  std::printf("weights in huge pages: %lld of %lld MiB\n",
              static_cast<long long>(AnonHugeKb() / 1024), static_cast<long long>(bytes >> 20));
  for (int64_t m : rows) {
    double best_mm = 1e30, best_read = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      double t0 = Now(wall);
      int64_t off = 0;
      for (int l = 0; l < layers; ++l) {
        for (const Shape& s : layer) {
          rl::kernels::MatmulParams p;
          p.x = x.data();
          p.w = w + off;
          p.w_dtype = rl::model_io::DType::kBF16;
          p.y = y.data();
          p.m = m;
          p.n = s.n;
          p.k = s.k;
          if (bf16_products) {
            kc::MatmulGroupBf16Products(absl::MakeConstSpan(&p, 1), &pool, plan);
          } else {
            kc::Matmul(p, &pool, plan);
          }
          off += s.n * s.k;
        }
      }
      best_mm = std::min(best_mm, Now(wall) - t0);
      t0 = Now(wall);
      pool.ParallelFor(threads, [&](int64_t b, int64_t e, int) {
        const int64_t lo = bytes * b / threads, hi = bytes * e / threads;
        g_sink = g_sink ^ kc::XorWords(reinterpret_cast<const uint8_t*>(w) + lo, hi - lo);
      });
      best_read = std::min(best_read, Now(wall) - t0);
    }
    const double gbs = static_cast<double>(bytes) / best_mm / 1e9;
    std::printf(
        "m %4lld: matmul %8.2f ms = %6.2f GB/s of weights, %6.1f GFLOP/s; read-only stream "
        "%6.2f GB/s; matmul at %3.0f%% of the read rate\n",
        static_cast<long long>(m), 1e3 * best_mm, gbs,
        2.0 * static_cast<double>(m * elems) / best_mm / 1e9,
        static_cast<double>(bytes) / best_read / 1e9, 100.0 * best_read / best_mm);
  }
  return 0;
}
