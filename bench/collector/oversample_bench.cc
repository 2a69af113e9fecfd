// oversample_bench: the time rl-collect takes to collect a batch of GRPO groups on a long-tail
// trace, without and with over-sampling (issue 34: --batch-groups B [--over-sample F]), in one
// run over an in-process rl-router and rl-worker (stories260K on the CPU backend).
//
// Trace: every group is a prompt row with --n samples; one group in --long-every is long (its
// samples generate --long x the short length, ignore_eos, so a few samples are 10x the
// median). Per round both sides collect from the same prompt set (long groups placed at random
// per round, the same density in the batch and in the over-sampled extra): "batch" submits the
// B groups and waits for all of them; "over-sample" submits ceil(F x B), keeps the first B
// that complete, aborts the rest through the router and saves their partial samples (they are
// resumed by the next batch, not lost: their count is printed). The two sides alternate which
// goes first per round; medians of --rounds are printed side by side. Timings on a shared
// machine are noisy: read the medians, and say the CPU and the load next to them.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/logging.h"
#include "nlohmann/json.hpp"
#include "services/collector/collector.h"
#include "services/router/router_server.h"
#include "services/worker/worker_server.h"

namespace {

namespace fs = std::filesystem;

struct Side {
  double seconds = 0;
  int64_t aborted_groups = 0;
  int64_t partials = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  if (const char* d = std::getenv("RL_TEST_DATA")) model = std::string(d) + "/stories260K";
  if (model.empty()) model = "../shared/models/stories260K";
  int batch = 16, n = 4, short_len = 16, long_factor = 10, long_every = 8, rounds = 5;
  int threads = 2;
  double over = 1.5;
  rl::FlagSet flags("oversample_bench");
  flags.String("model", &model, "model folder (default $RL_TEST_DATA/stories260K)");
  flags.Int("batch-groups", &batch, "groups per batch (B)");
  flags.Int("n", &n, "samples per group");
  flags.Int("short", &short_len, "output tokens of a short sample (the median)");
  flags.Int("long", &long_factor, "a long sample generates this many times the short length");
  flags.Int("long-every", &long_every, "one group in this many is long");
  flags.Double("over-sample", &over, "F: groups submitted = ceil(F x B)");
  flags.Int("rounds", &rounds, "rounds (medians printed)");
  flags.Int("threads", &threads, "the worker's CPU threads");
  if (auto rest = flags.Parse(argc, argv); !rest.ok()) {
    std::fprintf(stderr, "oversample_bench: %s\n", rest.status().ToString().c_str());
    return 2;
  }
  (void)rl::InitLogging("warn");
  rl::worker::WorkerConfig wc;
  wc.model_path = model;
  wc.port = 0;
  wc.kv_cache_gb = 0.25;
  wc.num_threads = threads;
  auto worker = rl::worker::WorkerServer::Start(wc);
  if (!worker.ok()) {
    std::fprintf(stderr, "oversample_bench: worker: %s\n", worker.status().ToString().c_str());
    return 1;
  }
  rl::router::RouterConfig rc;
  rc.tokenizer_path = model;
  rc.workers = {(*worker)->address()};
  rc.health_interval_ms = 100;
  auto router = rl::router::RouterServer::Start(rc);
  if (!router.ok()) {
    std::fprintf(stderr, "oversample_bench: router: %s\n", router.status().ToString().c_str());
    return 1;
  }
  const int submitted = static_cast<int>(std::ceil(over * batch - 1e-9));
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("rl_oversample_bench_", getpid());
  std::printf(
      "oversample_bench: %s, batch %d groups x n=%d, short %d tokens, long %d tokens (1 group "
      "in %d), over-sample %.2f (%d groups submitted), %d rounds\n",
      model.c_str(), batch, n, short_len, short_len * long_factor, long_every, over, submitted,
      rounds);
  std::vector<double> plain_s, over_s;
  int64_t partials = 0, aborted = 0;
  std::mt19937_64 rng(34);
  for (int r = 0; r < rounds; ++r) {
    // The prompt set of this round: long groups at random places, 1 in long_every of both the
    // batch and the extra.
    std::vector<bool> is_long(static_cast<size_t>(submitted), false);
    auto place = [&](int first, int count) {
      const int num_long = std::max(1, count / long_every);
      std::vector<int> idx(static_cast<size_t>(count));
      for (int i = 0; i < count; ++i) idx[static_cast<size_t>(i)] = first + i;
      std::shuffle(idx.begin(), idx.end(), rng);
      for (int i = 0; i < num_long && i < count; ++i) is_long[static_cast<size_t>(idx[i])] = true;
    };
    place(0, batch);
    if (submitted > batch) place(batch, submitted - batch);
    fs::create_directories(dir);
    const std::string prompts = (dir / absl::StrCat("prompts_", r, ".jsonl")).string();
    {
      std::ofstream f(prompts);
      for (int i = 0; i < submitted; ++i) {
        nlohmann::json row = {
            {"index", i},
            {"input_ids", {1, 403, 407, 261, 300 + (i * 7 + r) % 150}},
            {"sampling_params",
             {{"max_new_tokens",
               is_long[static_cast<size_t>(i)] ? short_len * long_factor : short_len},
              {"ignore_eos", true}}}};
        f << row.dump() << "\n";
      }
    }
    for (bool with_over : {r % 2 == 1, r % 2 == 0}) {
      rl::collector::CollectConfig c;
      c.router = (*router)->address();
      c.prompts = prompts;
      c.out = (dir / absl::StrCat("out_", r, with_over ? "_over" : "_plain")).string();
      c.n = n;
      c.concurrency = submitted * n;
      c.temperature = 1.0;
      c.seed = r;
      c.progress = "off";
      c.batch_groups = batch;
      c.over_sample = with_over ? over : 1.0;
      auto s = rl::collector::RunCollect(c);
      if (!s.ok()) {
        std::fprintf(stderr, "oversample_bench: %s\n", s.status().ToString().c_str());
        return 1;
      }
      (with_over ? over_s : plain_s).push_back(s->seconds);
      if (with_over) {
        partials += s->partials_saved;
        aborted += s->aborted_groups;
      }
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::printf("%-34s %12s %12s\n", "time to collect a batch (median)", "batch", "over-sample");
  std::printf("%-34s %12.3f %12.3f   (%.2fx)\n", "seconds", Median(plain_s), Median(over_s),
              Median(over_s) > 0 ? Median(plain_s) / Median(over_s) : 0.0);
  std::printf(
      "over-sample: %.1f groups aborted per batch, %.1f partial samples saved per batch "
      "(resumed by the next batch)\n",
      static_cast<double>(aborted) / rounds, static_cast<double>(partials) / rounds);
  (*router)->Shutdown();
  (*worker)->Shutdown();
  return 0;
}
