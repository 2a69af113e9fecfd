// update_bench: how fast UpdateWeightsFromDisk loads a checkpoint from the page cache.
//
// Makes a random 0.5B-class Qwen3 checkpoint (bf16, ~1 GB) with the maker (or uses --model),
// reads it once so it sits in the page cache, then times the worker's update path on the CPU
// runner: LoadWeightsFromDisk (open + validate + read into owned memory + atomic swap), and the
// same followed by a pass that reads every weight byte (no page is loaded lazily: owned weights
// are resident when the swap returns, and this pass shows it). Prints GB/s for both.
//
// Side by side, each round also times the zero-copy path the worker used before weights were
// owned (issue 15): mmap every shard and read every weight byte through the mapping, so the
// pages are really in memory (what the first forward pass after such an update paid). That
// path is unsafe (a rewritten checkpoint changes the served weights, a truncated one faults) and
// is only a reference here.
//
// Also side by side, each round loads the checkpoint a second time without the non-finite
// check (model_io::SetNonFiniteWeightsAllowed(true), the worker's --allow-non-finite-weights:
// plain 1 GiB preads, no scan), in alternating order, and the end prints the medians of both, so
// the cost of scanning for NaN / Inf while reading shows in one run.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "common/model_io/file_read.h"
#include "common/model_io/model_maker.h"
#include "common/model_io/safetensors.h"
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

// The pre-issue-15 reference: maps every shard read-only and reads one byte per 64 through the
// mapping (the same pass as the owned path's check below), then unmaps. Returns the byte sum
// (so the reads are not optimised away); -1 when a file cannot be mapped.
int64_t MmapAndReadEveryByte(const std::string& dir) {
  uint64_t sum = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
      ::close(fd);
      return -1;
    }
    const size_t size = static_cast<size_t>(st.st_size);
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return -1;
    const auto* bytes = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < size; i += 64) sum += bytes[i];
    ::munmap(p, size);
  }
  return static_cast<int64_t>(sum >> 1);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir;
  int rounds = 3;
  rl::FlagSet flags("update_bench");
  flags.String("model", &model_dir, "checkpoint folder (default: make a 0.5b qwen3 in /tmp)");
  flags.Int("rounds", &rounds, "timed updates");
  bool reclaimable = false;
  flags.Bool("reclaimable", &reclaimable,
             "spare read buffers marked MADV_FREE (the worker's --reclaimable-update-buffers)");
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
  rl::model_io::SetSpareBuffersReclaimable(reclaimable);
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
  // Wall and CPU seconds of LoadWeightsFromDisk with the non-finite check on ([0]) / off ([1]).
  std::vector<double> check_wall[2], check_cpu[2];
  auto timed_load = [&](bool check) -> bool {
    rl::model_io::SetNonFiniteWeightsAllowed(!check);
    const double cpu0 = CpuSeconds();
    const auto t0 = Clock::now();
    const absl::Status s = (*runner)->LoadWeightsFromDisk(model_dir);
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    rl::model_io::SetNonFiniteWeightsAllowed(false);
    if (!s.ok()) {
      std::cerr << s.message() << "\n";
      return false;
    }
    check_wall[check ? 0 : 1].push_back(wall);
    check_cpu[check ? 0 : 1].push_back(CpuSeconds() - cpu0);
    return true;
  };
  for (int r = 0; r < rounds; ++r) {
    for (const bool check : {r % 2 == 0, r % 2 != 0}) {
      if (!timed_load(check)) return 1;
    }
    std::cout << absl::StrFormat(
        "round %d: non-finite check on %.3f s (%.3f CPU s), off %.3f s (%.3f CPU s)\n", r + 1,
        check_wall[0].back(), check_cpu[0].back(), check_wall[1].back(), check_cpu[1].back());
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
    const double all_cpu = CpuSeconds() - cpu0;
    std::cout << absl::StrFormat(
        "round %d: swap %.3f s (%.1f GB/s); swap + read every weight byte %.3f s (%.2f GB/s) "
        "[swap: %.3f CPU s, %d page faults; byte sum %u]\n",
        r + 1, swap_s, bytes / 1e9 / swap_s, all_s, bytes / 1e9 / all_s, cpu_s, faults, sum);
    const double ref_cpu0 = CpuSeconds();
    const auto ref_t0 = Clock::now();
    const int64_t ref_sum = MmapAndReadEveryByte(model_dir);
    if (ref_sum < 0) {
      std::cerr << "cannot map the checkpoint's shards for the reference pass\n";
      return 1;
    }
    const double ref_s = std::chrono::duration<double>(Clock::now() - ref_t0).count();
    const double ref_cpu = CpuSeconds() - ref_cpu0;
    // The owned weights are resident once the swap returns (the bytes were just written by
    // this process), so "swap" alone compares with the reference's map + fault-in pass; the
    // owned path's own read-every-byte pass is shown too.
    std::cout << absl::StrFormat(
        "         reference (old zero-copy path): mmap + read every weight byte %.3f s "
        "(%.3f CPU s; byte sum %d); owned swap / reference: %.2fx wall, %.2fx CPU; "
        "owned swap + read / reference: %.2fx wall, %.2fx CPU\n",
        ref_s, ref_cpu, ref_sum * 2, swap_s / ref_s, cpu_s / ref_cpu, all_s / ref_s,
        all_cpu / ref_cpu);
  }
  std::cout << absl::StrFormat(
      "medians of %d rounds: non-finite check on %.3f s (%.3f CPU s, %.2f GB/s), off %.3f s "
      "(%.3f CPU s, %.2f GB/s): on / off %.2fx wall, %.2fx CPU\n",
      rounds, Median(check_wall[0]), Median(check_cpu[0]), bytes / 1e9 / Median(check_wall[0]),
      Median(check_wall[1]), Median(check_cpu[1]), bytes / 1e9 / Median(check_wall[1]),
      Median(check_wall[0]) / Median(check_wall[1]), Median(check_cpu[0]) / Median(check_cpu[1]));
  return 0;
}
