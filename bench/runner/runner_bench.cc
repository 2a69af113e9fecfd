// runner_bench: prefill and decode throughput of a ModelRunner at several batch sizes, peak
// memory, and the memory-bandwidth bound of decode (weight + KV bytes read per step divided by
// the measured read bandwidth) with the fraction of it achieved. On the CPU the read bandwidth
// is a STREAM-like read-only pass (XOR of every word) over 1 GiB, far larger than the L3, by
// the same number of threads as the runner; the memcpy rate is printed next to it for
// reference only (a copy moves twice the bytes it counts).
//
//   runner_bench [--backend cpu|cuda] [--model DIR]... [--make-qwen3-0.5b=true|false]
//                [--make-llama-8b=true|false] [--make-qwen3-moe-1b] [--batches 1,8,32]
//                [--prompt-len N] [--decode-steps N] [--threads N] [--batch-invariant]
//                [--bf16-products] [--prefill-reps N] [--decode-warmup N] [--op-profile]
//                [--huge-pages=true|false]
// With no --model it runs stories260K from $RL_TEST_DATA and a 0.5B-class random Qwen3 (bf16)
// made into a temp dir; with --backend cuda also an 8B-class random Llama-3 (bf16), batches
// 1,16,64,256 and 256-token prompts by default, and the nominal bf16 peak for the prefill.
// For MoE models the bound counts the experts each decode step actually routed to. Each batch
// line ends with the process CPU time of one prefill (every thread; spinning pool workers count):
// with --threads 1, a prefill figure that other processes on the machine do not inflate.
// --op-profile (CPU): after each timed prefill and decode, the time per op and shape per step
// (matmul GFLOP/s and GB/s of weights, the thread pool's synchronisation), from the CPU
// backend's OpProfile.
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/model_io/model_maker.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_ops.h"
#include "services/worker/model/cpu_model_runner.h"
#include "services/worker/model/cuda_runner.h"
#include "services/worker/model/transformer.h"

namespace {

using Clock = std::chrono::steady_clock;
using rl::model::ForwardInput;
using rl::model::ForwardOutput;
using rl::model::LogitsMode;
using rl::model::SequenceInput;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// CPU time of the whole process (every thread; spinning pool workers count): on a shared
// machine, with --threads 1, a figure that other processes do not inflate.
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Peak resident set (VmHWM) in MiB; mapped weight pages count once touched.
double PeakRssMiB() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

// Current resident set (VmRSS) in MiB.
double CurrentRssMiB() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long pages = 0, resident = 0;
  const int got = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return got == 2 ? static_cast<double>(resident) * 4096.0 / (1 << 20) : 0;
}

// Best-of-5 copy bandwidth (bytes copied per second) over a 128 MiB buffer with `threads`.
double CopyBandwidth(int threads) {
  const size_t bytes = size_t{128} << 20;
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  rl::kernels::cpu::ThreadPool pool(threads);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    pool.ParallelFor(threads, [&](int64_t b, int64_t e, int) {
      const size_t lo = bytes * static_cast<size_t>(b) / static_cast<size_t>(threads);
      const size_t hi = bytes * static_cast<size_t>(e) / static_cast<size_t>(threads);
      std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
    });
    best = std::max(best, static_cast<double>(bytes) / Seconds(t0, Clock::now()));
  }
  return best;
}

volatile uint64_t g_read_sink = 0;

// Best-of-5 read bandwidth (bytes read per second) of `threads` threads, each streaming its
// contiguous part of a 1 GiB buffer once per pass (the runner's pool and partition).
double ReadBandwidth(int threads) {
  const size_t bytes = size_t{1} << 30;
  std::vector<uint8_t> buf(bytes);
  for (size_t i = 0; i < bytes; i += 4096) buf[i] = static_cast<uint8_t>(i >> 12);
  rl::kernels::cpu::ThreadPool pool(threads);
  std::vector<uint64_t> sink(static_cast<size_t>(threads));
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    pool.ParallelFor(threads, [&](int64_t b, int64_t e, int part) {
      const size_t lo = bytes * static_cast<size_t>(b) / static_cast<size_t>(threads);
      const size_t hi = bytes * static_cast<size_t>(e) / static_cast<size_t>(threads);
      sink[static_cast<size_t>(part)] ^=
          rl::kernels::cpu::XorWords(buf.data() + lo, static_cast<int64_t>(hi - lo));
    });
    best = std::max(best, static_cast<double>(bytes) / Seconds(t0, Clock::now()));
  }
  for (uint64_t v : sink) g_read_sink = g_read_sink ^ v;  // keeps the reads observable
  return best;
}

struct Options {
  std::string backend = "cpu";
  std::vector<std::string> models;
  bool make_big = true;
  bool make_8b = true;  // cuda only
  bool make_moe = false;
  std::vector<int> batches;
  int prompt_len = 0;
  int decode_steps = 16;
  int decode_warmup = 2;
  int prefill_reps = 1;
  int threads = 0;
  bool batch_invariant = false;
  bool bf16_products = false;
  bool huge_pages = true;
  bool op_profile = false;
};

struct WeightStats {
  double params = 0;
  double bytes_per_token = 0;  // every tensor, one embedding row when the head is untied
  double expert_bytes = 0;     // MoE: all experts' tensors (included in bytes_per_token)
};

// Distinct (layer, expert) pairs in one step's routing ([tokens, layers, top_k]).
double DistinctExperts(const ForwardOutput& out, int64_t layers, int64_t top_k) {
  std::set<std::pair<int64_t, int32_t>> seen;
  const int64_t width = layers * top_k;
  for (size_t i = 0; i < out.routed_experts.size(); ++i) {
    seen.emplace((static_cast<int64_t>(i) % width) / top_k, out.routed_experts[i]);
  }
  return static_cast<double>(seen.size());
}

WeightStats CountWeights(const rl::model::ModelRunner& r) {
  WeightStats st;
  double total = 0;
  double embed = 0;
  for (const rl::model::TensorInfo& t : r.ListWeights()) {
    double n = 1;
    for (int64_t d : t.shape) n *= static_cast<double>(d);
    st.params += n;
    const double bytes =
        n * static_cast<double>(rl::model_io::DTypeSize(*rl::model_io::ParseDType(t.dtype)));
    total += bytes;
    if (t.name == "model.embed_tokens.weight") embed = bytes;
    if (t.name.find(".mlp.experts.") != std::string::npos) st.expert_bytes += bytes;
  }
  if (!r.config().tie_word_embeddings) total -= embed - embed / r.config().vocab_size;
  st.bytes_per_token = total;
  return st;
}

// Parses argv with the project's flag parser: --help prints the usage, unknown flags and bad
// values are rejected (exit 2). nullopt: go on.
std::optional<int> ParseArgs(int argc, char** argv, Options* o) {
  rl::FlagSet flags("runner_bench");
  std::string batches;
  flags.String("backend", &o->backend, "cpu | cuda");
  flags.StringList("model", &o->models,
                   "model folder (repeatable; default: stories260K + made ones)");
  flags.Bool("make-qwen3-0.5b", &o->make_big, "also bench a made 0.5B-class Qwen3");
  flags.Bool("make-llama-8b", &o->make_8b, "cuda: also bench a made 8B-class Llama-3");
  flags.Bool("make-qwen3-moe-1b", &o->make_moe,
             "also bench a made 1B-class Qwen3-MoE (32 experts, top-4)");
  flags.String("batches", &batches, "comma-separated batch sizes");
  flags.Int("prompt-len", &o->prompt_len, "prompt tokens (0: backend default)");
  flags.Int("decode-steps", &o->decode_steps, "timed decode steps");
  flags.Int("decode-warmup", &o->decode_warmup, "untimed decode steps before the timed ones");
  flags.Int("prefill-reps", &o->prefill_reps,
            "timed prefills after the warm-up; the mean is printed (llama-bench's -r)");
  flags.Int("threads", &o->threads, "CPU threads (0: all)");
  flags.Bool("batch-invariant", &o->batch_invariant, "batch-invariant GEMMs");
  flags.Bool("huge-pages", &o->huge_pages,
             "cpu: the served weights in 2 MiB pages (the worker's --cpu-huge-pages; the bench "
             "waits until they are moved before it times anything)");
  flags.Bool("bf16-products", &o->bf16_products,
             "cpu: bf16 activations and products (the worker's --cpu-bf16-products; not exact)");
  flags.Bool("op-profile", &o->op_profile, "cpu: time per op and shape after each phase");
  if (std::optional<int> exit = flags.ParseMain(argc, argv)) return exit;
  if (!batches.empty()) {
    for (absl::string_view part : absl::StrSplit(batches, ',')) {
      int n = 0;
      if (!absl::SimpleAtoi(part, &n) || n <= 0) {
        std::fprintf(stderr, "runner_bench: --batches: '%s' is not a positive integer\n",
                     std::string(part).c_str());
        return 2;
      }
      o->batches.push_back(n);
    }
  }
  if (o->prompt_len < 0 || o->decode_steps <= 0 || o->threads < 0 || o->prefill_reps < 1 ||
      o->prefill_reps > 100 || o->decode_warmup < 0 || o->decode_warmup > 1000) {
    std::fprintf(stderr,
                 "runner_bench: --prompt-len and --threads must be >= 0, --decode-steps > 0, "
                 "--decode-warmup in [0, 1000], --prefill-reps in [1, 100]\n");
    return 2;
  }
  return std::nullopt;
}

int Bench(const std::string& name, const std::string& dir, const Options& o, double bandwidth) {
  const bool cuda = o.backend == "cuda";
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const int32_t stride = o.prompt_len + o.decode_warmup + o.decode_steps + 16;
  rl::model::RunnerOptions ro;
  ro.model_dir = dir;
  ro.num_threads = o.threads;
  ro.num_kv_slots = static_cast<int64_t>(max_batch) * stride;
  ro.batch_invariant = o.batch_invariant;
  ro.cpu_bf16_products = o.bf16_products;
  ro.cpu_huge_pages = o.huge_pages;
  ro.cpu_op_profile = o.op_profile && !cuda;
  rl::kernels::cpu::OpProfile* profile = nullptr;
  std::optional<rl::model::HugePageCollapser::Stats> huge_pages;
  absl::StatusOr<std::unique_ptr<rl::model::ModelRunner>> runner;
  if (cuda) {
    runner = rl::model::CreateCudaModelRunner(ro);
  } else if (auto cpu = rl::model::CpuModelRunner::Create(ro); cpu.ok()) {
    profile = (*cpu)->op_profile();
    // Nothing is timed while the weights move into 2 MiB pages (the worker serves meanwhile).
    huge_pages = (*cpu)->WaitForHugePages();
    runner = std::unique_ptr<rl::model::ModelRunner>(std::move(*cpu));
  } else {
    runner = cpu.status();
  }
  if (!runner.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), runner.status().ToString().c_str());
    return 1;
  }
  rl::model::ModelRunner& r = **runner;
  const auto& c = r.config();
  const WeightStats weights = CountWeights(r);
  const double weight_bytes = weights.bytes_per_token;
  const double params = weights.params;
  // MoE: a step reads the weights outside the experts plus the experts it routes to; the bound
  // uses the distinct (layer, expert) pairs the step's tokens actually touched.
  const int64_t moe_layers = static_cast<int64_t>(c.MoeLayers().size());
  const double one_expert_bytes =
      moe_layers > 0 ? weights.expert_bytes / static_cast<double>(moe_layers * c.num_experts) : 0;
  const double non_expert_bytes = weight_bytes - weights.expert_bytes;
  // The CUDA runner keeps a bf16 KV cache by default, the CPU float32.
  const double kv_bytes_per_token = static_cast<double>(rl::model::Transformer::KvBytesPerSlot(
      c, cuda ? rl::model_io::DType::kBF16 : rl::model_io::DType::kF32));
  std::printf(
      "\n== %s (%s, %s, %.1f M params, %.1f MiB weights read per token, %s)\n", name.c_str(),
      c.architecture_name.c_str(), c.torch_dtype.c_str(), params / 1e6, weight_bytes / (1 << 20),
      cuda ? (o.batch_invariant ? "cuda, batch-invariant" : "cuda")
           : (std::to_string(o.threads) + " threads" + (o.bf16_products ? ", bf16 products" : ""))
                 .c_str());
  if (huge_pages) {
    std::printf("weights in 2 MiB pages: %.0f MiB (moved in %.2f s; %.0f MiB refused)\n",
                static_cast<double>(huge_pages->collapsed_bytes) / (1 << 20), huge_pages->seconds,
                static_cast<double>(huge_pages->refused_bytes) / (1 << 20));
  }
  for (int batch : o.batches) {
    ForwardInput in;
    ForwardOutput out;
    for (int b = 0; b < batch; ++b) {
      SequenceInput s;
      for (int i = 0; i < o.prompt_len; ++i) {
        s.token_ids.push_back(static_cast<int32_t>((b * 131 + i * 7 + 3) % c.vocab_size));
        s.kv_slots.push_back(b * stride + i);
      }
      in.seqs.push_back(std::move(s));
    }
    // Warm-up (pages weights in, sizes the buffers), then timed prefill.
    if (absl::Status st = r.Forward(in, &out); !st.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), st.ToString().c_str());
      return 1;
    }
    if (profile != nullptr) profile->Clear();
    const auto t0 = Clock::now();
    const double cpu0 = ProcessCpuSeconds();
    for (int rep = 0; rep < o.prefill_reps; ++rep) {  // the same prompt into the same slots
      if (!r.Forward(in, &out).ok()) return 1;
    }
    const double prefill_s = Seconds(t0, Clock::now()) / o.prefill_reps;
    const double prefill_cpu_s = (ProcessCpuSeconds() - cpu0) / o.prefill_reps;
    if (profile != nullptr) {
      std::printf("  prefill of %d x %d tokens, per prefill (%.3f ms):\n%s", batch, o.prompt_len,
                  1e3 * prefill_s,
                  profile->Report(o.prefill_reps, prefill_s * o.prefill_reps).c_str());
      profile->Clear();
    }
    for (int b = 0; b < batch; ++b) {
      SequenceInput& s = in.seqs[static_cast<size_t>(b)];
      s.start_pos = o.prompt_len;
      s.token_ids = {static_cast<int32_t>(b % c.vocab_size)};
      s.kv_slots.push_back(b * stride + o.prompt_len);
    }
    in.return_routing = moe_layers > 0;
    double touched = 0;  // (layer, expert) pairs read, summed over the timed steps
    auto decode_step = [&](bool timed) {
      if (!r.Forward(in, &out).ok()) return false;
      if (timed && moe_layers > 0) {
        touched += DistinctExperts(out, moe_layers, c.num_experts_per_tok);
      }
      for (int b = 0; b < batch; ++b) {
        SequenceInput& s = in.seqs[static_cast<size_t>(b)];
        s.start_pos += 1;
        s.kv_slots.push_back(b * stride + s.start_pos);
      }
      return true;
    };
    // Untimed steps first (llama-bench warms up too): the pool's workers back from sleep, the
    // step's buffers sized for decode.
    for (int step = 0; step < o.decode_warmup; ++step) {
      if (!decode_step(false)) return 1;
    }
    if (profile != nullptr) profile->Clear();
    const auto t1 = Clock::now();
    const double cpu1 = ProcessCpuSeconds();
    for (int step = 0; step < o.decode_steps; ++step) {
      if (!decode_step(true)) return 1;
    }
    const double decode_s = Seconds(t1, Clock::now());
    const double decode_cpu_s = ProcessCpuSeconds() - cpu1;
    if (profile != nullptr) {
      std::printf("  decode of %d sequences, per step (%.3f ms):\n%s", batch,
                  1e3 * decode_s / o.decode_steps,
                  profile->Report(o.decode_steps, decode_s).c_str());
    }
    const double prefill_tps = batch * o.prompt_len / prefill_s;
    const double step_s = decode_s / o.decode_steps;
    // Bound: one step reads the weights once and every sequence's KV (mean context).
    const double mean_ctx = o.prompt_len + o.decode_warmup + (o.decode_steps + 1) / 2.0;
    const double mean_touched = touched / o.decode_steps;
    const double step_weight_bytes =
        moe_layers > 0 ? non_expert_bytes + mean_touched * one_expert_bytes : weight_bytes;
    const double step_bytes = step_weight_bytes + batch * mean_ctx * kv_bytes_per_token;
    const double bound_step_s = step_bytes / bandwidth;
    std::printf(
        "batch %3d: prefill %10.1f tok/s (%d x %d tokens, %.1f TFLOP/s)   decode %10.1f "
        "tok/s (%.3f ms/step; bound %.3f ms = %.0f%%; CPU %.3f ms/step); prefill CPU %.1f ms\n",
        batch, prefill_tps, batch, o.prompt_len, 2.0 * params * prefill_tps / 1e12, batch / step_s,
        1e3 * step_s, 1e3 * bound_step_s, 100.0 * bound_step_s / step_s,
        1e3 * decode_cpu_s / o.decode_steps, 1e3 * prefill_cpu_s);
    if (moe_layers > 0) {
      std::printf(
          "           experts touched per decode step: %.1f of %lld (layer, expert) pairs = "
          "%.1f MiB of %.1f MiB expert weights; weights read per step %.1f MiB\n",
          mean_touched, static_cast<long long>(moe_layers * c.num_experts),
          mean_touched * one_expert_bytes / (1 << 20), weights.expert_bytes / (1 << 20),
          step_weight_bytes / (1 << 20));
    }
  }
  std::printf(
      "bound = (weights %.1f MiB + KV %.1f KiB/token x batch x context) / %.1f GB/s "
      "%s bandwidth\n",
      weight_bytes / (1 << 20), kv_bytes_per_token / 1024, bandwidth / 1e9,
      cuda ? "device copy" : "read");
  std::printf("RSS with this model loaded: %.0f MiB (process peak so far %.0f MiB)\n",
              CurrentRssMiB(), PeakRssMiB());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (std::optional<int> exit = ParseArgs(argc, argv, &o)) return *exit;
  const bool cuda = o.backend == "cuda";
  if (o.backend != "cpu" && !cuda) {
    std::fprintf(stderr, "--backend: '%s' is not cpu or cuda\n", o.backend.c_str());
    return 2;
  }
  if (o.batches.empty())
    o.batches = cuda ? std::vector<int>{1, 16, 64, 256} : std::vector<int>{1, 8, 32};
  if (o.prompt_len == 0) o.prompt_len = cuda ? 256 : 32;
  double bandwidth = 0;
  if (cuda) {
    if (rl::model::NumCudaDevices() == 0) {
      std::fprintf(stderr, "--backend cuda: no CUDA device visible (or built without CUDA)\n");
      return 2;
    }
    auto device = rl::model::DescribeCudaDevice(0);
    auto bw = rl::model::MeasureCudaCopyBandwidth(0, int64_t{1} << 30);
    if (!bw.ok()) {
      std::fprintf(stderr, "copy bandwidth: %s\n", bw.status().ToString().c_str());
      return 1;
    }
    bandwidth = *bw;
    std::printf(
        "device %s: device copy bandwidth %.0f GB/s (read + write); nominal dense bf16 "
        "peak 989 TFLOP/s on H100/H200 SXM\n",
        device.ok() ? device->c_str() : "?", bandwidth / 1e9);
  } else {
    const int threads = o.threads > 0
                            ? o.threads
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    o.threads = threads;
    std::printf("cpu: %s\ncpu kernels: %s\n", rl::kernels::cpu::GetCpuInfo().Describe().c_str(),
                rl::kernels::cpu::GetKernelPlan().Describe().c_str());
    bandwidth = ReadBandwidth(threads);
    std::printf(
        "read bandwidth (%d threads, 1 GiB read-only stream): %.2f GB/s read; memcpy %.2f GB/s "
        "copied (for reference: a copy also writes)\n",
        threads, bandwidth / 1e9, CopyBandwidth(threads) / 1e9);
  }

  std::vector<std::pair<std::string, std::string>> models;
  for (const auto& m : o.models) models.emplace_back(m, m);
  std::vector<std::string> made;  // temp dirs to remove at the end
  // Makes a random checkpoint into a temp dir and queues it; false on error.
  auto make = [&](const std::string& arch, const std::string& size, uint64_t seed) {
    const std::string dir =
        (std::filesystem::temp_directory_path() /
         ("runner_bench_" + arch + "_" + size + "_" + std::to_string(::getpid())))
            .string();
    rl::model_io::MakeModelOptions mo;
    mo.arch = arch;
    mo.size = size;
    mo.seed = seed;
    mo.out_dir = dir;
    const auto t0 = Clock::now();
    made.push_back(dir);
    if (absl::Status st = rl::model_io::MakeModel(mo); !st.ok()) {
      std::fprintf(stderr, "make model: %s\n", st.ToString().c_str());
      return false;
    }
    std::printf("made %s %s (bf16) in %.1f s\n", arch.c_str(), size.c_str(),
                Seconds(t0, Clock::now()));
    models.emplace_back(arch + "-" + size + "-random", dir);
    return true;
  };
  bool ok = true;
  if (o.models.empty()) {
    if (const char* data = std::getenv("RL_TEST_DATA")) {
      models.emplace_back("stories260K", std::string(data) + "/stories260K");
    }
    if (o.make_big) ok = ok && make("qwen3", "0.5b", 1);
    if (cuda && o.make_8b) ok = ok && make("llama", "8b", 2);
    if (o.make_moe) ok = ok && make("qwen3_moe", "1b", 3);
  }
  int rc = ok ? 0 : 1;
  if (ok) {
    for (const auto& [name, dir] : models) rc |= Bench(name, dir, o, bandwidth);
  }
  for (const std::string& dir : made) std::filesystem::remove_all(dir);
  return rc;
}
