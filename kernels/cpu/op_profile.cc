#include "kernels/cpu/op_profile.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rl::kernels::cpu {

void OpProfile::Add(const char* op, std::string shape, const Row& sample) {
  Row* row = nullptr;
  for (Row& r : rows_) {
    if (r.op == op && r.shape == shape) row = &r;
  }
  if (row == nullptr) {
    rows_.push_back(Row{op, std::move(shape)});
    row = &rows_.back();
  }
  ++row->calls;
  row->seconds += sample.seconds;
  row->flops += sample.flops;
  row->weight_bytes += sample.weight_bytes;
  row->sync_seconds += sample.sync_seconds;
  row->regions += sample.regions;
}

std::vector<OpProfile::Row> OpProfile::Sorted() const {
  std::vector<Row> rows = rows_;
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.seconds > b.seconds; });
  return rows;
}

double OpProfile::TotalSeconds() const {
  double total = 0;
  for (const Row& r : rows_) total += r.seconds;
  return total;
}

std::string OpProfile::Report(int64_t steps, double wall_seconds) const {
  const double per = 1.0 / static_cast<double>(std::max<int64_t>(1, steps));
  std::string out = absl::StrFormat("    %-10s %-34s %7s %9s %6s %9s %8s %8s\n", "op", "shape",
                                    "calls", "ms/step", "share", "GFLOP/s", "GB/s W", "sync ms");
  for (const Row& r : Sorted()) {
    std::string rate = "-", bw = "-";
    if (r.flops > 0 && r.seconds > 0) rate = absl::StrFormat("%.1f", r.flops / r.seconds / 1e9);
    if (r.weight_bytes > 0 && r.seconds > 0) {
      bw = absl::StrFormat("%.1f", r.weight_bytes / r.seconds / 1e9);
    }
    absl::StrAppendFormat(&out, "    %-10s %-34s %7.1f %9.3f %5.1f%% %9s %8s %8.3f\n", r.op,
                          r.shape, static_cast<double>(r.calls) * per, 1e3 * r.seconds * per,
                          wall_seconds > 0 ? 100.0 * r.seconds / wall_seconds : 0.0, rate, bw,
                          1e3 * r.sync_seconds * per);
  }
  double total = 0, sync = 0;
  for (const Row& r : rows_) {
    total += r.seconds;
    sync += r.sync_seconds;
  }
  absl::StrAppendFormat(&out,
                        "    %-10s %-34s %7s %9.3f %5.1f%% %9s %8s %8.3f  (the rest of the step "
                        "runs outside the ops)\n",
                        "all ops", "", "", 1e3 * total * per,
                        wall_seconds > 0 ? 100.0 * total / wall_seconds : 0.0, "", "",
                        1e3 * sync * per);
  return out;
}

}  // namespace rl::kernels::cpu
