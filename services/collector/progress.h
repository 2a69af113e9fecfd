// Progress reporting for rl-collect: a one-line bar redrawn in place on a terminal
// (done / total, samples/s, ETA, failures), plain log lines every few seconds otherwise, and a
// final summary. No Debian package offers a C++ progress bar, so this is a small renderer.
// Not thread-safe: the collector's writer thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace rl::collector {

struct ProgressCounts {
  int64_t done = 0;  // saved or in the write buffer, this run and earlier runs
  int64_t total = 0;
  int64_t failed = 0;   // samples that finally failed (recorded with their status)
  int64_t retries = 0;  // collector-level retries this run
};

class Progress {
 public:
  // `tty`: draw the bar on `out`; otherwise log a line every `log_every`.
  Progress(FILE* out, bool tty, int64_t done_at_start,
           std::chrono::milliseconds log_every = std::chrono::seconds(10));
  // Redraws when due (at most every 100 ms on a terminal).
  void Update(const ProgressCounts& c);
  // Ends the bar and prints the summary line.
  void Finish(const ProgressCounts& c);
  // "[#####.....]  120/400  30.0 samples/s  ETA 9s  failed 0"
  std::string Line(const ProgressCounts& c, int bar_width) const;

 private:
  FILE* out_;
  bool tty_;
  int64_t done_at_start_;
  std::chrono::milliseconds log_every_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
};

}  // namespace rl::collector
