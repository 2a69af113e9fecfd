// inflight_update_bench: output tokens/s through a weight update on the CPU backend, the
// default update (pause retract -> swap -> flush -> continue: every running request's KV is
// recomputed) against the in-flight update (pause in place -> swap -> keep the KV -> continue,
// issue 34's keep_kv), in one run, alternating the two per round.
//
//   inflight_update_bench [--model DIR] [--requests 32] [--prompt 256] [--output 256]
//                         [--threads N] [--rounds 3]
//
// Without --model it writes the maker's tiny Llama (seed 1, context 1024) to a temp folder. Per
// round and mode: `requests` concurrent requests of `prompt` random tokens + `output` generated
// tokens (ignore_eos, seeded temperature 1); once half of all output tokens are out, a staged
// copy of the weights (read before, like ActivateWeights) is swapped in the way the update
// lifecycle does it. Printed per mode (medians over rounds): the update's engine-thread pause,
// the time until every request produced its next token after it, and the output tokens/s from
// the update to the end of the batch. Wall-clock figures: meaningful side by side in one run.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/model_io/model_maker.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/cpu_model_runner.h"
#include "services/worker/model/weights.h"

namespace rl::engine {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string model;
  int requests = 32;
  int prompt = 256;
  int output = 256;
  int threads = 0;
  int rounds = 3;
};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Round {
  double pause_ms = 0;       // the update's engine-thread step
  double next_token_ms = 0;  // update start -> every request produced one more token
  double tok_per_s = 0;      // output tokens from the update to the end / that time
};

// Counts streamed tokens and finishes, and the tokens each request streamed.
class Tally {
 public:
  explicit Tally(int n) : per_request_(static_cast<size_t>(n)) {}
  RequestCallbacks Callbacks(int i) {
    RequestCallbacks cb;
    cb.on_output = [this, i](const OutputChunk& c) {
      per_request_[static_cast<size_t>(i)].fetch_add(static_cast<int64_t>(c.token_ids.size()));
      tokens_.fetch_add(static_cast<int64_t>(c.token_ids.size()));
    };
    cb.on_finish = [this](GenerateResult) { finished_.fetch_add(1); };
    return cb;
  }
  int64_t tokens() const { return tokens_.load(); }
  int64_t of(int i) const { return per_request_[static_cast<size_t>(i)].load(); }
  int finished() const { return finished_.load(); }

 private:
  std::vector<std::atomic<int64_t>> per_request_;
  std::atomic<int64_t> tokens_{0};
  std::atomic<int> finished_{0};
};

template <typename Pred>
void Spin(Pred pred) {
  while (!pred()) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

absl::StatusOr<Round> RunOnce(const Flags& f, bool keep_kv, uint64_t seed) {
  model::RunnerOptions ro;
  ro.model_dir = f.model;
  ro.num_kv_slots = static_cast<int64_t>(f.requests) * (f.prompt + f.output + 16);
  ro.num_threads = f.threads;
  auto runner = model::CreateCpuModelRunner(ro);
  if (!runner.ok()) return runner.status();
  const model_io::ModelConfig config = (*runner)->config();
  auto staged = model::LoadWeights(f.model, config);
  if (!staged.ok()) return staged.status();
  EngineOptions eo;
  eo.scheduler.max_running_requests = f.requests;
  auto engine = Engine::Create(std::move(runner).value(), eo);
  if (!engine.ok()) return engine.status();
  Engine& e = **engine;
  Tally tally(f.requests);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < f.requests; ++i) {
    GenerateRequest r;
    r.id = absl::StrCat("r", i);
    for (int t = 0; t < f.prompt; ++t) {
      r.input_ids.push_back(3 + static_cast<int32_t>(rng() % (config.vocab_size - 3)));
    }
    r.sampling.temperature = 1.0;
    r.sampling.seed = seed + static_cast<uint64_t>(i);
    r.sampling.max_new_tokens = f.output;
    r.sampling.ignore_eos = true;
    if (absl::Status s = e.Submit(std::move(r), tally.Callbacks(i)); !s.ok()) return s;
  }
  const int64_t total = static_cast<int64_t>(f.requests) * f.output;
  Spin([&] { return tally.tokens() >= total / 2; });
  std::vector<int64_t> before(static_cast<size_t>(f.requests));
  const Clock::time_point t0 = Clock::now();
  const int64_t tokens0 = tally.tokens();
  absl::Status s = e.RunOnEngineThread([&](EngineContext& ctx) -> absl::Status {
    for (int i = 0; i < f.requests; ++i) before[static_cast<size_t>(i)] = tally.of(i);
    ctx.Pause(keep_kv ? PauseMode::kInPlace : PauseMode::kRetract);
    if (absl::Status a = ctx.runner().ActivateWeights(&*staged, f.model, ""); !a.ok()) return a;
    ctx.set_weight_version(ctx.weight_version() + 1);
    if (keep_kv) {
      ctx.KeepKvThroughUpdate();
    } else if (absl::Status fl = ctx.FlushCache(); !fl.ok()) {
      return fl;
    }
    ctx.Continue();
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  const Clock::time_point t1 = Clock::now();
  Spin([&] {
    for (int i = 0; i < f.requests; ++i) {
      const int64_t b = before[static_cast<size_t>(i)];
      if (b < f.output && tally.of(i) <= b) return false;
    }
    return true;
  });
  const Clock::time_point t2 = Clock::now();
  Spin([&] { return tally.finished() == f.requests; });
  const Clock::time_point t3 = Clock::now();
  Round out;
  out.pause_ms = Seconds(t0, t1) * 1e3;
  out.next_token_ms = Seconds(t0, t2) * 1e3;
  out.tok_per_s = static_cast<double>(tally.tokens() - tokens0) / Seconds(t0, t3);
  return out;
}

int Main(int argc, char** argv) {
  Flags f;
  FlagSet flags("inflight_update_bench");
  flags.String("model", &f.model, "model folder (default: a made tiny llama)");
  flags.Int("requests", &f.requests, "concurrent requests");
  flags.Int("prompt", &f.prompt, "prompt tokens per request");
  flags.Int("output", &f.output, "output tokens per request");
  flags.Int("threads", &f.threads, "CPU threads (0: all)");
  flags.Int("rounds", &f.rounds, "rounds per mode (medians are printed)");
  if (std::optional<int> exit = flags.ParseMain(argc, argv)) return *exit;
  if (f.requests < 1 || f.prompt < 1 || f.output < 2 || f.rounds < 1) {
    std::fprintf(stderr, "inflight_update_bench: requests, prompt, rounds >= 1, output >= 2\n");
    return 2;
  }
  std::string tmp;
  if (f.model.empty()) {
    tmp = (std::filesystem::temp_directory_path() / absl::StrCat("inflight_bench_", getpid()))
              .string();
    model_io::MakeModelOptions mo;
    mo.arch = "llama";
    mo.size = "tiny";
    mo.seed = 1;
    mo.out_dir = tmp;
    if (absl::Status s = model_io::MakeModel(mo); !s.ok()) {
      std::fprintf(stderr, "inflight_update_bench: make model: %s\n", s.ToString().c_str());
      return 1;
    }
    f.model = tmp;
  }
  std::printf("inflight_update_bench: model %s, %d requests x (prompt %d + output %d), %d rounds\n",
              f.model.c_str(), f.requests, f.prompt, f.output, f.rounds);
  std::vector<Round> retract, keep;
  int rc = 0;
  for (int r = 0; r < f.rounds && rc == 0; ++r) {
    for (bool keep_kv : {r % 2 == 1, r % 2 == 0}) {  // alternate which mode goes first
      absl::StatusOr<Round> one = RunOnce(f, keep_kv, 1000 + static_cast<uint64_t>(r));
      if (!one.ok()) {
        std::fprintf(stderr, "inflight_update_bench: %s\n", one.status().ToString().c_str());
        rc = 1;
        break;
      }
      (keep_kv ? keep : retract).push_back(*one);
    }
  }
  if (rc == 0) {
    auto median = [](const std::vector<Round>& v, double Round::*field) {
      std::vector<double> x;
      for (const Round& r : v) x.push_back(r.*field);
      return Median(x);
    };
    std::printf("%-28s %14s %18s %22s\n", "update (medians)", "pause ms", "next token ms",
                "out tok/s from update");
    for (const auto& [name, v] :
         {std::pair<const char*, const std::vector<Round>*>{"retract + recompute", &retract},
          {"in flight (keep_kv)", &keep}}) {
      std::printf("%-28s %14.2f %18.2f %22.0f\n", name, median(*v, &Round::pause_ms),
                  median(*v, &Round::next_token_ms), median(*v, &Round::tok_per_s));
    }
  }
  if (!tmp.empty()) std::filesystem::remove_all(tmp);
  return rc;
}

}  // namespace
}  // namespace rl::engine

int main(int argc, char** argv) { return rl::engine::Main(argc, argv); }
