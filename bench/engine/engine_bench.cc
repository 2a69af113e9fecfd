// engine_bench: throughput and control latency of the engine on the CPU backend.
//
//   engine_bench [--model DIR] [--requests 256] [--prompt 128] [--output 128] [--prefix 512]
//                [--threads N] [--page-size 16] [--chunk 2048]
//                [--scenarios no_prefix,distinct_prefix,shared_prefix,control]
//
// Without --model it writes the maker's tiny Llama (seed 1, context 1024) to a temp folder.
// Scenarios, each with `requests` concurrent requests of `prompt` unique tokens + `output`
// generated tokens (ignore_eos, seeded temperature 1):
//   no_prefix        the prompt alone
//   distinct_prefix  a different `prefix`-token prefix per request (nothing to share)
//   shared_prefix    the same `prefix`-token prefix for every request (radix cache reuse)
// then, with the requests of a fresh batch decoding, the latency of pause(in_place),
// continue, pause(retract) and continue, and the time until the retracted batch has produced
// its next token again (re-prefill).
//
// Every throughput row also reports the engine thread's own CPU time (CLOCK_THREAD_CPUTIME_ID
// of the engine thread, read through pthread_getcpuclockid) per engine step: a figure that a
// shared, noisy machine disturbs much less than wall time. The CPU runner's worker threads are
// not counted (the engine thread's share of the forward pass is). bench/engine/compare.py runs
// two engine_bench binaries alternately and prints both side by side.
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/flags.h"
#include "common/model_io/model_maker.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/cpu_model_runner.h"

namespace rl::engine {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Flags {
  std::string model;
  int requests = 256;
  int prompt = 128;
  int output = 128;
  int prefix = 512;
  int threads = 0;
  int page_size = 16;
  int chunk = 2048;
  std::string scenarios_csv = "no_prefix,distinct_prefix,shared_prefix,control";
  std::vector<std::string> scenarios;
  bool Wants(const std::string& name) const {
    return std::find(scenarios.begin(), scenarios.end(), name) != scenarios.end();
  }
};

// Parses argv with the project's flag parser: --help prints the usage, unknown flags and bad
// values are rejected (exit 2). nullopt: go on.
std::optional<int> ParseFlags(int argc, char** argv, Flags* f) {
  FlagSet flags("engine_bench");
  flags.String("model", &f->model, "model folder (default: a made tiny llama)");
  flags.Int("requests", &f->requests, "concurrent requests");
  flags.Int("prompt", &f->prompt, "prompt tokens per request");
  flags.Int("output", &f->output, "output tokens per request");
  flags.Int("prefix", &f->prefix, "shared prefix tokens (radix cache run)");
  flags.Int("threads", &f->threads, "CPU threads (0: all)");
  flags.Int("page-size", &f->page_size, "KV page size in tokens");
  flags.Int("chunk", &f->chunk, "chunked prefill tokens");
  flags.String("scenarios", &f->scenarios_csv,
               "comma-separated scenarios: no_prefix, distinct_prefix, shared_prefix, control");
  if (std::optional<int> exit = flags.ParseMain(argc, argv)) return exit;
  f->scenarios = absl::StrSplit(f->scenarios_csv, ',', absl::SkipEmpty());
  for (const std::string& name : f->scenarios) {
    if (name != "no_prefix" && name != "distinct_prefix" && name != "shared_prefix" &&
        name != "control") {
      std::fprintf(stderr, "engine_bench: --scenarios: unknown scenario '%s'\n", name.c_str());
      return 2;
    }
  }
  for (const auto& [name, v] : {std::pair<const char*, int>{"requests", f->requests},
                                {"prompt", f->prompt},
                                {"output", f->output},
                                {"page-size", f->page_size},
                                {"chunk", f->chunk}}) {
    if (v <= 0) {
      std::fprintf(stderr, "engine_bench: --%s: must be > 0, got %d\n", name, v);
      return 2;
    }
  }
  if (f->prefix < 0 || f->threads < 0) {
    std::fprintf(stderr, "engine_bench: --prefix and --threads must be >= 0\n");
    return 2;
  }
  return std::nullopt;
}

// Counts finished completions and streamed tokens.
class Tracker {
 public:
  RequestCallbacks Callbacks() {
    RequestCallbacks cb;
    cb.on_output = [this](const OutputChunk& c) {
      absl::MutexLock lock(&mu_);
      tokens_ += static_cast<int64_t>(c.token_ids.size());
    };
    cb.on_finish = [this](GenerateResult r) {
      absl::MutexLock lock(&mu_);
      ++finished_;
      cached_ += r.cached_tokens;
      if (r.finish_reason.kind == FinishKind::kAbort) ++aborted_;
    };
    return cb;
  }
  void WaitFinished(int64_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ >= n; };
    mu_.Await(absl::Condition(&done));
  }
  void WaitTokens(int64_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return tokens_ >= n; };
    mu_.Await(absl::Condition(&done));
  }
  int64_t tokens() {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  int64_t cached() {
    absl::MutexLock lock(&mu_);
    return cached_;
  }
  int64_t aborted() {
    absl::MutexLock lock(&mu_);
    return aborted_;
  }

 private:
  absl::Mutex mu_;
  int64_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cached_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t aborted_ ABSL_GUARDED_BY(mu_) = 0;
};

std::vector<int32_t> Tokens(int n, uint64_t seed, int64_t vocab) {
  std::vector<int32_t> t;
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (int i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t.push_back(3 + static_cast<int32_t>(x % static_cast<uint64_t>(vocab - 3)));
  }
  return t;
}

GenerateRequest MakeRequest(const std::string& id, std::vector<int32_t> prompt, int output,
                            uint64_t seed) {
  GenerateRequest r;
  r.id = id;
  r.input_ids = std::move(prompt);
  r.sampling.temperature = 1.0;
  r.sampling.seed = seed;
  r.sampling.max_new_tokens = output;
  r.sampling.ignore_eos = true;
  return r;
}

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const Flags& f, int64_t num_kv_slots) {
  model::RunnerOptions ro;
  ro.model_dir = f.model;
  ro.page_size = f.page_size;
  ro.num_kv_slots = num_kv_slots;
  ro.num_threads = f.threads;
  auto runner = model::CreateCpuModelRunner(ro);
  if (!runner.ok()) return runner.status();
  EngineOptions eo;
  eo.scheduler.max_running_requests = f.requests;
  eo.scheduler.chunked_prefill_size = f.chunk;
  return Engine::Create(std::move(runner).value(), eo);
}

enum class Prefix { kNone, kDistinct, kShared };

// The CPU-time clock of the engine's thread, read from any thread.
absl::StatusOr<clockid_t> EngineThreadClock(Engine& engine) {
  clockid_t clock{};
  int rc = 0;
  absl::Status s = engine.RunOnEngineThread([&](EngineContext&) {
    rc = pthread_getcpuclockid(pthread_self(), &clock);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  if (rc != 0) return absl::InternalError(absl::StrCat("pthread_getcpuclockid: error ", rc));
  return clock;
}

double CpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int RunThroughput(const Flags& f, const char* name, Prefix prefix) {
  const int prefix_len = prefix == Prefix::kNone ? 0 : f.prefix;
  const int64_t slots =
      static_cast<int64_t>(f.requests) * (prefix_len + f.prompt + f.output) + 4 * f.page_size;
  auto engine = MakeEngine(f, slots);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine_bench: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  const int64_t vocab = (*engine)->model_config().vocab_size;
  const std::vector<int32_t> shared = Tokens(prefix_len, 424242, vocab);
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < f.requests; ++i) {
    std::vector<int32_t> p = prefix == Prefix::kShared     ? shared
                             : prefix == Prefix::kDistinct ? Tokens(prefix_len, 1000000 + i, vocab)
                                                           : std::vector<int32_t>();
    const std::vector<int32_t> own = Tokens(f.prompt, i + 1, vocab);
    p.insert(p.end(), own.begin(), own.end());
    requests.push_back(MakeRequest(absl::StrCat(name, i), std::move(p), f.output, i));
  }
  absl::StatusOr<clockid_t> clock = EngineThreadClock(**engine);
  if (!clock.ok()) {
    std::fprintf(stderr, "engine_bench: %s\n", clock.status().ToString().c_str());
    return 1;
  }
  const int64_t steps_before = (*engine)->GetServerInfo().num_steps;
  Tracker t;
  const double cpu_start = CpuSeconds(*clock);
  const Clock::time_point start = Clock::now();
  for (GenerateRequest& r : requests) {
    absl::Status s = (*engine)->Submit(std::move(r), t.Callbacks());
    if (!s.ok()) {
      std::fprintf(stderr, "engine_bench: submit: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  t.WaitFinished(f.requests);
  const double secs = Seconds(start, Clock::now());
  const double cpu = CpuSeconds(*clock) - cpu_start;
  const ServerInfo info = (*engine)->GetServerInfo();
  const int64_t steps = info.num_steps - steps_before;
  std::printf("%-16s %8d %10.2f %12.1f %14.1f %12lld %10.3f %8lld %14.4f\n", name, f.requests,
              f.requests / secs, t.tokens() / secs,
              static_cast<double>(info.scheduler.prompt_tokens) / secs,
              static_cast<long long>(info.scheduler.cache_hit_tokens), secs,
              static_cast<long long>(steps), steps > 0 ? cpu * 1e3 / steps : 0.0);
  std::fflush(stdout);
  return 0;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int RunControlLatency(const Flags& f) {
  const int64_t slots = static_cast<int64_t>(f.requests) * (f.prompt + f.output) + 4 * f.page_size;
  auto engine_or = MakeEngine(f, slots);
  if (!engine_or.ok()) return 1;
  Engine& engine = **engine_or;
  const int64_t vocab = engine.model_config().vocab_size;
  std::vector<double> pause_in_place, cont_in_place, pause_retract, cont_retract, resume_token;
  const int rounds = 5;
  for (int round = 0; round < rounds; ++round) {
    Tracker t;
    for (int i = 0; i < f.requests; ++i) {
      absl::Status s =
          engine.Submit(MakeRequest(absl::StrCat("c", round, "_", i),
                                    Tokens(f.prompt, 7 * i + round, vocab), f.output, i),
                        t.Callbacks());
      if (!s.ok()) return 1;
    }
    // Wait until every request is decoding (a few tokens each).
    t.WaitTokens(static_cast<int64_t>(f.requests) * 4);

    Clock::time_point a = Clock::now();
    if (!engine.Pause(PauseMode::kInPlace).ok()) return 1;
    Clock::time_point b = Clock::now();
    if (!engine.Continue().ok()) return 1;
    Clock::time_point c = Clock::now();
    pause_in_place.push_back(Seconds(a, b) * 1e3);
    cont_in_place.push_back(Seconds(b, c) * 1e3);

    t.WaitTokens(t.tokens() + f.requests);
    a = Clock::now();
    if (!engine.Pause(PauseMode::kRetract).ok()) return 1;
    b = Clock::now();
    const int64_t tokens_at_pause = t.tokens();
    if (!engine.Continue().ok()) return 1;
    c = Clock::now();
    t.WaitTokens(tokens_at_pause + f.requests);  // every request produced one more token
    const Clock::time_point d = Clock::now();
    pause_retract.push_back(Seconds(a, b) * 1e3);
    cont_retract.push_back(Seconds(b, c) * 1e3);
    resume_token.push_back(Seconds(c, d) * 1e3);
    if (!engine.AbortAll("bench round done").ok()) return 1;
    t.WaitFinished(f.requests);
    if (!engine.FlushCache().ok()) return 1;
  }
  std::printf("\ncontrol latency with %d decoding requests, ms (median / max of %d):\n", f.requests,
              rounds);
  auto row = [](const char* name, const std::vector<double>& v) {
    std::printf("  %-34s %8.3f / %8.3f\n", name, Median(v), *std::max_element(v.begin(), v.end()));
  };
  row("pause(in_place)", pause_in_place);
  row("continue after in_place", cont_in_place);
  row("pause(retract)", pause_retract);
  row("continue after retract", cont_retract);
  row("retract: continue -> next token", resume_token);
  return 0;
}

int Main(int argc, char** argv) {
  Flags f;
  if (std::optional<int> exit = ParseFlags(argc, argv, &f)) return *exit;
  std::string tmp;
  if (f.model.empty()) {
    tmp =
        (std::filesystem::temp_directory_path() / absl::StrCat("engine_bench_", getpid())).string();
    model_io::MakeModelOptions mo;
    mo.arch = "llama";
    mo.size = "tiny";
    mo.seed = 1;
    mo.out_dir = tmp;
    absl::Status s = model_io::MakeModel(mo);
    if (!s.ok()) {
      std::fprintf(stderr, "engine_bench: make model: %s\n", s.ToString().c_str());
      return 1;
    }
    f.model = tmp;
  }
  std::printf(
      "engine_bench: model %s, %d requests x (prompt %d + output %d), prefix %d, "
      "page %d, chunk %d, threads %d\n\n",
      f.model.c_str(), f.requests, f.prompt, f.output, f.prefix, f.page_size, f.chunk, f.threads);
  std::printf("%-16s %8s %10s %12s %14s %12s %10s %8s %14s\n", "scenario", "requests", "req/s",
              "out tok/s", "prompt tok/s", "cache hits", "seconds", "steps", "eng cpu ms/step");
  int rc = 0;
  if (f.Wants("no_prefix")) rc = RunThroughput(f, "no_prefix", Prefix::kNone);
  if (rc == 0 && f.prefix > 0 && f.Wants("distinct_prefix")) {
    rc = RunThroughput(f, "distinct_prefix", Prefix::kDistinct);
  }
  if (rc == 0 && f.prefix > 0 && f.Wants("shared_prefix")) {
    rc = RunThroughput(f, "shared_prefix", Prefix::kShared);
  }
  if (rc == 0 && f.Wants("control")) rc = RunControlLatency(f);
  if (!tmp.empty()) std::filesystem::remove_all(tmp);
  return rc;
}

}  // namespace
}  // namespace rl::engine

int main(int argc, char** argv) { return rl::engine::Main(argc, argv); }
