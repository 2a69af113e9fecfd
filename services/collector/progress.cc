#include "services/collector/progress.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace rl::collector {
namespace {

std::string Duration(double s) {
  if (s < 0 || s > 1e8) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%dh%02dm", t / 3600, (t / 60) % 60);
  if (t >= 60) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%ds", t);
}

}  // namespace

Progress::Progress(FILE* out, bool tty, int64_t done_at_start, std::chrono::milliseconds log_every)
    : out_(out), tty_(tty), done_at_start_(done_at_start), log_every_(log_every) {}

std::string Progress::Line(const ProgressCounts& c, int bar_width) const {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t this_run = c.done - done_at_start_;
  const double rate = elapsed > 0 ? this_run / elapsed : 0;
  const double eta = rate > 0 ? (c.total - c.done) / rate : -1;
  std::string bar;
  if (bar_width > 0) {
    const int fill =
        c.total > 0 ? static_cast<int>(bar_width * std::min<int64_t>(c.done, c.total) / c.total)
                    : 0;
    bar = "[" + std::string(static_cast<size_t>(fill), '#') +
          std::string(static_cast<size_t>(bar_width - fill), '.') + "] ";
  }
  return absl::StrFormat("%s%d/%d  %.1f samples/s  ETA %s  failed %d  retries %d", bar, c.done,
                         c.total, rate, c.done >= c.total ? "0s" : Duration(eta), c.failed,
                         c.retries);
}

void Progress::Update(const ProgressCounts& c) {
  const auto now = std::chrono::steady_clock::now();
  const auto every = tty_ ? std::chrono::milliseconds(100) : log_every_;
  if (drawn_ && now - last_draw_ < every) return;
  last_draw_ = now;
  drawn_ = true;
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", Line(c, 30).c_str());
  } else {
    std::fprintf(out_, "rl-collect: %s\n", Line(c, 0).c_str());
  }
  std::fflush(out_);
}

void Progress::Finish(const ProgressCounts& c) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (tty_) std::fprintf(out_, "\r\033[K%s\n", Line(c, 30).c_str());
  std::fputs(absl::StrFormat("rl-collect: %d/%d samples done (%d this run in %s), %d failed, "
                             "%d retries\n",
                             c.done, c.total, c.done - done_at_start_, Duration(elapsed), c.failed,
                             c.retries)
                 .c_str(),
             out_);
  std::fflush(out_);
}

}  // namespace rl::collector
