// update_bench: how fast UpdateWeightsFromDisk loads a checkpoint from the page cache.
//
// Makes a random 0.5B-class Qwen3 checkpoint (bf16, ~1 GB) with the maker (or uses --model),
// reads it once so it sits in the page cache, then times the worker's update path on the CPU
// runner: LoadWeightsFromDisk (open + validate + read into owned memory + atomic swap), and the same followed by a
// pass that reads every weight byte (so any lazily loaded page is really loaded). Prints GB/s for
// both; the second is the honest "loaded" figure.
#include <sys/resource.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "common/model_io/model_maker.h"
#include "services/worker/model/cpu_model_runner.h"

namespace {

using Clock = std::chrono::steady_clock;

int64_t DirBytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") total += static_cast<int64_t>(e.file_size());
  }
  return total;
}

// Page faults of this process so far (minor: memory the kernel hands out or maps in).
int64_t MinorFaults() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// CPU seconds (user + system, all threads) this process used so far: unlike wall time, not
// inflated when other processes compete for the cores.
double CpuSeconds() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

void WarmPageCache(const std::string& dir) {
  std::vector<char> buf(1 << 22);
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir;
  int rounds = 3;
  rl::FlagSet flags("update_bench");
  flags.String("model", &model_dir, "checkpoint folder (default: make a 0.5b qwen3 in /tmp)");
  flags.Int("rounds", &rounds, "timed updates");
  if (std::optional<int> exit = flags.ParseMain(argc, argv)) return *exit;
  if (rounds < 1) {
    std::cerr << "update_bench: --rounds: must be >= 1\n";
    return 2;
  }
  std::string made;
  if (model_dir.empty()) {
    made = (std::filesystem::temp_directory_path() / "rl-update-bench-qwen3-0.5b").string();
    rl::model_io::MakeModelOptions m;
    m.arch = "qwen3";
    m.size = "0.5b";
    m.seed = 1;
    m.out_dir = made;
    if (!std::filesystem::exists(made + "/model.safetensors")) {
      std::cout << "making a 0.5b qwen3 checkpoint in " << made << " ...\n";
      if (auto s = rl::model_io::MakeModel(m); !s.ok()) {
        std::cerr << s.message() << "\n";
        return 1;
      }
    }
    model_dir = made;
  }
  rl::model::RunnerOptions options;
  options.model_dir = model_dir;
  options.num_kv_slots = 1024;
  auto runner = rl::model::CreateCpuModelRunner(options);
  if (!runner.ok()) {
    std::cerr << runner.status().message() << "\n";
    return 1;
  }
  const int64_t bytes = DirBytes(model_dir);
  WarmPageCache(model_dir);
  std::cout << absl::StrFormat("checkpoint %s: %.2f GB of safetensors (page cache warm)\n",
                               model_dir, bytes / 1e9);
  for (int r = 0; r < rounds; ++r) {
    const int64_t faults0 = MinorFaults();
    const double cpu0 = CpuSeconds();
    const auto t0 = Clock::now();
    if (auto s = (*runner)->LoadWeightsFromDisk(model_dir); !s.ok()) {
      std::cerr << s.message() << "\n";
      return 1;
    }
    const double swap_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const int64_t faults = MinorFaults() - faults0;
    const double cpu_s = CpuSeconds() - cpu0;
    uint64_t sum = 0;
    (void)(*runner)->VisitWeights([&](const rl::model::TensorInfo&, absl::Span<const uint8_t> b) {
      for (size_t i = 0; i < b.size(); i += 64) sum += b[i];
    });
    const double all_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::cout << absl::StrFormat(
        "round %d: swap %.3f s (%.1f GB/s); swap + read every weight byte %.3f s (%.2f GB/s) "
        "[swap: %.3f CPU s, %d page faults; byte sum %u]\n",
        r + 1, swap_s, bytes / 1e9 / swap_s, all_s, bytes / 1e9 / all_s, cpu_s, faults, sum);
  }
  return 0;
}
