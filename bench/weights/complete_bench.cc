// complete_bench: how long a full-state two-phase group update (PrepareWeightsUpdate +
// CompleteWeightsUpdate of every served tensor) takes to answer, and how long until the worker
// knows the served digest (GetLoad.weights_sha256), on the CPU runner.
//
//   complete_bench [--size 0.5b] [--rounds 5] [--staging-nice 10] [--threads 1] [--work DIR]
//
// It makes two Llama checkpoints of --size (bf16, seeds 1 and 2; `tiny` for a smoke run) in
// --work: the served one, and the trainer's, handed out by an in-process receiver at memory
// speed, so the figures are the worker's own (the wait for the received data is excluded: each
// Complete starts once the receiver has handed out every tensor). Per round it prints the answer
// time of Complete (apply into the served weights, flush, version bump, resume) and the time
// from the call until the served digest is known (polled every millisecond); medians at the end.
// The digest is computed after the answer (docs/weight-updates.md, "The digest after the
// answer"), so the second figure is what the answer cost when it waited for the hash.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/flags.h"
#include "common/model_io/model_config.h"
#include "common/model_io/model_maker.h"
#include "common/model_io/safetensors.h"
#include "common/status.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/cpu_model_runner.h"
#include "services/worker/model/model_runner.h"
#include "services/worker/weights/weight_update_controller.h"

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The trainer's side of a group, in process: every Receive hands out the checkpoint's tensors
// and then counts itself in `*received`.
class CheckpointReceiver final : public rl::weight_sync::WeightReceiver {
 public:
  CheckpointReceiver(const rl::model_io::Checkpoint* source, rl::weight_sync::GroupOptions options,
                     std::atomic<int>* received)
      : source_(source), options_(std::move(options)), received_(received) {}
  absl::Status Receive(const std::vector<rl::weight_sync::TensorSpec>& specs,
                       const rl::weight_sync::TensorCallback& on_tensor,
                       const std::function<void()>& on_posted) override {
    if (on_posted) on_posted();
    for (const auto& spec : specs) {
      if (absl::Status s = on_tensor(spec, source_->tensors().at(spec.name).data); !s.ok()) {
        return s;
      }
    }
    received_->fetch_add(1);
    return absl::OkStatus();
  }
  void Close() override {}
  const rl::weight_sync::GroupOptions& options() const override { return options_; }

 private:
  const rl::model_io::Checkpoint* source_;
  rl::weight_sync::GroupOptions options_;
  std::atomic<int>* received_;
};

absl::Status Run(const std::string& model_dir, const std::string& trainer_dir, int rounds,
                 int staging_nice, int threads) {
  ASSIGN_OR_RETURN(rl::model_io::Checkpoint trainer, rl::model_io::OpenCheckpoint(trainer_dir));
  rl::model::RunnerOptions ro;
  ro.model_dir = model_dir;
  ro.num_threads = threads;
  ro.kv_cache_bytes = int64_t{64} << 20;
  ASSIGN_OR_RETURN(std::unique_ptr<rl::model::ModelRunner> runner,
                   rl::model::CreateCpuModelRunner(ro));
  ASSIGN_OR_RETURN(std::unique_ptr<rl::engine::Engine> engine,
                   rl::engine::Engine::Create(std::move(runner), rl::engine::EngineOptions{}));
  rl::worker::WeightUpdateController::Deps deps;
  deps.engine = engine.get();
  ASSIGN_OR_RETURN(deps.model_config, rl::model_io::LoadModelConfig(model_dir));
  deps.staging_nice = staging_nice;
  std::atomic<int> received{0};
  deps.connect = [&trainer, &received](const rl::weight_sync::GroupOptions& options)
      -> absl::StatusOr<std::unique_ptr<rl::weight_sync::WeightReceiver>> {
    return std::make_unique<CheckpointReceiver>(&trainer, options, &received);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<rl::worker::WeightUpdateController> updates,
                   rl::worker::WeightUpdateController::Create(std::move(deps)));
  rl::worker::GroupRequest join;
  join.master_address = "127.0.0.1";
  join.master_port = 1;
  join.rank_offset = 1;
  join.world_size = 2;
  join.group_name = "train";
  RETURN_IF_ERROR(updates->InitWeightsUpdateGroup(join).status());
  rl::worker::WeightBuckets buckets(1);
  int64_t bytes = 0;
  for (const auto& [name, t] : trainer.tensors()) {
    buckets[0].push_back({name, std::string(rl::model_io::DTypeName(t.dtype)), t.shape});
    bytes += static_cast<int64_t>(t.data.size());
  }
  std::printf("model %s: %zu tensors, %.1f MB per full sync; --staging-nice %d, %d threads\n",
              model_dir.c_str(), buckets[0].size(), static_cast<double>(bytes) / 1e6, staging_nice,
              threads);
  std::vector<double> answer_ms, digest_ms;
  for (int round = 0; round < rounds; ++round) {
    RETURN_IF_ERROR(updates->PrepareWeightsUpdate("train", buckets).status());
    const Clock::time_point posted = Clock::now();
    while (received.load() <= round && MsSince(posted) < 600e3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (received.load() <= round) return absl::InternalError("the receive did not end in 600 s");
    const Clock::time_point start = Clock::now();
    rl::worker::UpdatePolicy policy;
    policy.weight_version = round + 1;
    RETURN_IF_ERROR(updates->CompleteWeightsUpdate("train", policy).status());
    const double answered = MsSince(start);
    while (updates->served_sha256().empty() && MsSince(start) < 600e3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (updates->served_sha256().empty()) return absl::InternalError("no digest after 600 s");
    const double known = MsSince(start);
    std::printf("round %d: Complete answered in %.1f ms; served digest known after %.1f ms\n",
                round + 1, answered, known);
    answer_ms.push_back(answered);
    digest_ms.push_back(known);
  }
  std::printf("median of %d: Complete answered in %.1f ms; served digest known after %.1f ms\n",
              rounds, Median(answer_ms), Median(digest_ms));
  updates->Shutdown();
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::string size = "0.5b";
  std::string work = (fs::temp_directory_path() / "complete_bench").string();
  int rounds = 5, staging_nice = 10, threads = 1;
  rl::FlagSet flags("complete_bench");
  flags.String("size", &size, "the made Llama's size: tiny, 0.5b, 1b, 8b");
  flags.String("work", &work, "scratch folder for the made models (removed at the end)");
  flags.Int("rounds", &rounds, "full syncs (medians)");
  flags.Int("staging-nice", &staging_nice, "the worker's --staging-nice");
  flags.Int("threads", &threads, "CPU threads of the runner");
  if (std::optional<int> exit = flags.ParseMain(argc, argv)) return *exit;
  if (rounds < 1 || staging_nice < 0 || staging_nice > 19 || threads < 0) {
    std::fprintf(stderr, "complete_bench: a flag is out of range (see --help)\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::fflush(stdout);
  (void)std::system("lscpu | grep 'Model name'; nproc; uptime");
  std::error_code ec;
  fs::remove_all(work, ec);
  fs::create_directories(work);
  rl::model_io::MakeModelOptions m;
  m.arch = "llama";
  m.size = size;
  m.seed = 2;
  m.out_dir = work + "/trainer";
  absl::Status s = rl::model_io::MakeModel(m);
  if (s.ok()) {
    m.seed = 1;
    m.out_dir = work + "/served";
    s = rl::model_io::MakeModel(m);
  }
  if (s.ok()) s = Run(work + "/served", work + "/trainer", rounds, staging_nice, threads);
  fs::remove_all(work, ec);
  (void)std::system("uptime");
  if (!s.ok()) {
    std::fprintf(stderr, "complete_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
