#include "common/metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"

namespace rl {
namespace {

void AtomicAdd(std::atomic<double>& target, double v) {
  double cur = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string RenderLabels(const Labels& labels, const std::string& extra_key = "",
                         const std::string& extra_value = "") {
  if (labels.empty() && extra_key.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    absl::StrAppend(&out, first ? "" : ",", k, "=\"", EscapeLabelValue(v), "\"");
    first = false;
  }
  if (!extra_key.empty()) {
    absl::StrAppend(&out, first ? "" : ",", extra_key, "=\"", extra_value, "\"");
  }
  out += "}";
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.9g", v);
}

}  // namespace

void Counter::Inc(double v) { AtomicAdd(value_, v); }
void Gauge::Add(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  RL_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()));
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, v);
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

MetricsRegistry::Series* MetricsRegistry::GetSeries(const std::string& name,
                                                    const std::string& help, Kind kind,
                                                    const Labels& labels) {
  auto [it, inserted] = families_.try_emplace(name);
  Family& family = it->second;
  if (inserted) {
    family.kind = kind;
    family.help = help;
  }
  RL_CHECK(family.kind == kind);  // one name, one kind
  Series& series = family.series[RenderLabels(labels)];
  series.labels = labels;
  return &series;
}

Counter* MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Series* s = GetSeries(name, help, Kind::kCounter, labels);
  if (!s->counter) s->counter = std::make_unique<Counter>();
  return s->counter.get();
}

Gauge* MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Series* s = GetSeries(name, help, Kind::kGauge, labels);
  if (!s->gauge) s->gauge = std::make_unique<Gauge>();
  return s->gauge.get();
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         const std::vector<double>& bounds, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  Series* s = GetSeries(name, help, Kind::kHistogram, labels);
  if (!s->histogram) s->histogram = std::make_unique<Histogram>(bounds);
  return s->histogram.get();
}

void MetricsRegistry::SetGaugeCallback(const std::string& name, const std::string& help,
                                       const Labels& labels, std::function<double()> fn) {
  absl::MutexLock lock(&mu_);
  GetSeries(name, help, Kind::kGauge, labels)->callback = std::move(fn);
}

void MetricsRegistry::RemoveSeries(const std::string& name, const std::string& key,
                                   const std::string& value) {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return;
  auto& series = it->second.series;
  for (auto s = series.begin(); s != series.end();) {
    const Labels& l = s->second.labels;
    const bool match = std::any_of(
        l.begin(), l.end(), [&](const auto& kv) { return kv.first == key && kv.second == value; });
    s = match ? series.erase(s) : std::next(s);
  }
}

std::string MetricsRegistry::RenderPrometheus() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    const char* type = family.kind == Kind::kCounter ? "counter"
                       : family.kind == Kind::kGauge ? "gauge"
                                                     : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", family.help, "\n# TYPE ", name, " ", type, "\n");
    for (const auto& [label_text, s] : family.series) {
      if (s.counter)
        absl::StrAppend(&out, name, label_text, " ", FormatValue(s.counter->value()), "\n");
      if (s.gauge || s.callback) {
        const double v = s.callback ? s.callback() : s.gauge->value();
        absl::StrAppend(&out, name, label_text, " ", FormatValue(v), "\n");
      }
      if (s.histogram) {
        const auto counts = s.histogram->BucketCounts();
        uint64_t cumulative = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
          cumulative += counts[i];
          const std::string le =
              i < s.histogram->bounds().size() ? FormatValue(s.histogram->bounds()[i]) : "+Inf";
          absl::StrAppend(&out, name, "_bucket", RenderLabels(s.labels, "le", le), " ", cumulative,
                          "\n");
        }
        absl::StrAppend(&out, name, "_sum", label_text, " ", FormatValue(s.histogram->sum()), "\n",
                        name, "_count", label_text, " ", s.histogram->count(), "\n");
      }
    }
  }
  return out;
}

}  // namespace rl
