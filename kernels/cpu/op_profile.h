// OpProfile: where a CPU forward pass spends its time, per op and shape (runner_bench
// --op-profile). The CPU backend, when given one, times every op it runs (wall clock around the
// kernel call, validation excluded) and adds it under a key such as "matmul" / "m=16
// n=2048+1024+1024 k=1024", with the op's floating-point operations and bytes of weights read,
// so a report can give GFLOP/s and GB/s per shape, and the thread pool's synchronisation time
// within it (the calling thread waiting for the other parts of its parallel regions,
// ThreadPool::Stats).
// Cost when profiling: two clock reads and a short linear search per op (a few hundred per
// decode step); nothing when no profile is attached. Thread safety: one thread at a time (the
// runner's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rl::kernels::cpu {

class OpProfile {
 public:
  struct Row {
    std::string op;
    std::string shape;
    int64_t calls = 0;
    double seconds = 0;
    double flops = 0;         // floating-point operations over all calls
    double weight_bytes = 0;  // bytes of weights read over all calls
    double sync_seconds = 0;  // of `seconds`, waiting at the end of parallel regions
    int64_t regions = 0;      // parallel regions run
  };

  // Adds one call of `op` on `shape`; `sample` holds its figures (calls is ignored).
  void Add(const char* op, std::string shape, const Row& sample);
  void Clear() { rows_.clear(); }
  // Rows by decreasing time.
  std::vector<Row> Sorted() const;
  double TotalSeconds() const;

  // A table of the rows, each call count, time and rate divided by `steps` (the steps the
  // profile covers), with each row's share of `wall_seconds` (the steps' measured time).
  std::string Report(int64_t steps, double wall_seconds) const;

 private:
  std::vector<Row> rows_;
};

}  // namespace rl::kernels::cpu
