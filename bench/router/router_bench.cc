// router_bench: router benchmarks. The text-cache part (cache_bench.h) replays a multi-turn
// workload through TextCache; the router-vs-direct latency part belongs next to it, in its own
// file, selected by its own flags.
#include <sched.h>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/router/cache_bench.h"
#include "bench/router/latency_bench.h"
#include "common/flags.h"

int main(int argc, char** argv) {
  rl::bench::CacheBenchConfig cache_config;
  rl::FlagSet flags("router_bench");
  flags.String("workload", &cache_config.workload_path,
               "cache workload JSONL (see ../shared/bench/README.md); runs the cache benchmark");
  flags.Int("max-cache-size", &cache_config.max_cache_size, "cache size limit in tokens");
  flags.Int("gc-threshold-k", &cache_config.gc_threshold_k, "GC keeps versions > current - k");
  flags.Int("trajectories-per-version", &cache_config.trajectories_per_version,
            "weight version = 1 + trajectory index / this");
  flags.Int("limit", &cache_config.limit, "replay at most this many trajectories (0: all)");
  flags.String("seam-tokenizer", &cache_config.seam_tokenizer_dir,
               "also replay through the seam check with this tokenizer folder");
  flags.Int("seam-limit", &cache_config.seam_limit, "trajectories of the seam-check replay");
  flags.Bool("persistence", &cache_config.persistence,
             "also replay with the durable store (--cache-dir's SQLite) and time its recovery");
  flags.String("persist-dir", &cache_config.persist_dir,
               "folder for that store (default: a temporary one, removed after)");
  flags.Int("durable-threads", &cache_config.durable_threads,
            "replayers that each wait for their insert to be durable (the router's pattern)");
  rl::bench::LatencyBenchConfig latency;
  bool run_latency = false;
  flags.Bool("latency", &run_latency, "run the router-vs-direct latency and throughput benchmark");
  flags.String("tokenizer", &latency.tokenizer_dir, "latency: the router's tokenizer folder");
  flags.Int("requests", &latency.requests, "latency: sequential requests per measurement");
  flags.Int("concurrency", &latency.concurrency, "latency: streams for the throughput run");
  flags.Int("throughput-requests", &latency.throughput_requests,
            "latency: requests in the throughput run");
  flags.Int("workers", &latency.num_workers, "latency: fast workers behind the router");
  flags.StringList("router-binary", &latency.router_binaries,
                   "latency: LABEL=PATH of an rl-router binary to run side by side (repeatable; "
                   "e.g. before=OLD/rl-router after=build/bin/rl-router)");
  std::vector<std::string> streams;
  flags.StringList("streams", &streams,
                   "latency: concurrent streams of the side-by-side runs (repeatable; default "
                   "1000 and 10000)");
  flags.Int("rounds", &latency.rounds, "latency: requests per stream in the side-by-side runs");
  std::vector<std::string> router_cpus, bench_cpus;
  flags.StringList("router-cpus", &router_cpus,
                   "latency: pin the side-by-side rl-router processes to these CPUs (e.g. 1)");
  flags.StringList("bench-cpus", &bench_cpus,
                   "pin this process (clients, fake workers, in-process router) to these CPUs "
                   "(e.g. 0)");
  if (std::optional<int> exit = flags.ParseMain(argc, argv)) return *exit;
  auto cpu_list = [](const char* flag, const std::vector<std::string>& in, std::vector<int>* out) {
    for (const std::string& s : in) {
      for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
        int cpu = 0;
        if (!absl::SimpleAtoi(part, &cpu) || cpu < 0 || cpu >= CPU_SETSIZE) {
          std::cerr << "router_bench: --" << flag << ": '" << part << "' is not a CPU number\n";
          return false;
        }
        out->push_back(cpu);
      }
    }
    return true;
  };
  std::vector<int> bench_cpu_ids;
  if (!cpu_list("router-cpus", router_cpus, &latency.router_cpus) ||
      !cpu_list("bench-cpus", bench_cpus, &bench_cpu_ids)) {
    return 2;
  }
  if (!bench_cpu_ids.empty()) {
    // Before any thread starts: every later thread inherits the mask.
    if (absl::Status s = rl::bench::PinToCpus(bench_cpu_ids); !s.ok()) {
      std::cerr << "router_bench: --bench-cpus: " << s.message() << "\n";
      return 2;
    }
  }
  if (!streams.empty()) {
    latency.streams.clear();
    for (const std::string& s : streams) {
      int n = 0;
      if (!absl::SimpleAtoi(s, &n) || n < 1 || n > 100000) {
        std::cerr << "router_bench: --streams: '" << s << "' is not in [1, 100000]\n";
        return 2;
      }
      latency.streams.push_back(n);
    }
  }
  if (!cache_config.workload_path.empty()) {
    if (absl::Status s = rl::bench::RunCacheBench(cache_config, std::cout); !s.ok()) {
      std::cerr << "router_bench: " << s.message() << "\n";
      return 1;
    }
  }
  if (run_latency) {
    if (latency.tokenizer_dir.empty()) {
      std::cerr << "router_bench: --latency needs --tokenizer DIR\n";
      return 2;
    }
    if (absl::Status s = rl::bench::RunLatencyBench(latency, std::cout); !s.ok()) {
      std::cerr << "router_bench: " << s.message() << "\n";
      return 1;
    }
  }
  if (cache_config.workload_path.empty() && !run_latency) {
    std::cerr << "router_bench: nothing to run (--workload FILE and/or --latency)\n";
    return 2;
  }
  return 0;
}
