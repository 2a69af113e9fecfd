// Metrics registry rendering the Prometheus text exposition format (version 0.0.4).
//
// Components declare their metrics once, in one table, named rl_<component>_<what>_<unit>.
// Counters, gauges and histograms are lock-free to update (atomics); label sets are created
// on first use under a mutex and live as long as the registry. Callback gauges are read at
// render time. Rendering takes the registry mutex and costs O(number of series).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rl {

// Label pairs, e.g. {{"worker", "127.0.0.1:5000"}}. Order is kept as given.
using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Inc(double v = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Cumulative histogram with fixed upper bounds (ascending; +Inf is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket (non-cumulative) counts; the last entry is the +Inf bucket.
  std::vector<uint64_t> BucketCounts() const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

// Exponential bucket bounds: start, start*factor, ... (count values).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Returns the series for (name, labels), creating the family on first use. The pointer is
  // valid for the registry's lifetime. Using one name with two kinds is a programming error.
  Counter* GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const Labels& labels = {});
  // A gauge computed at render time. Replaces a previous callback with the same series.
  void SetGaugeCallback(const std::string& name, const std::string& help, const Labels& labels,
                        std::function<double()> fn);
  // Drops every series of `name` whose labels contain (key, value) (e.g. a removed worker).
  void RemoveSeries(const std::string& name, const std::string& key, const std::string& value);

  std::string RenderPrometheus() const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Series {
    Labels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
    std::function<double()> callback;
  };
  struct Family {
    Kind kind;
    std::string help;
    std::map<std::string, Series> series;  // keyed by rendered label string
  };
  Series* GetSeries(const std::string& name, const std::string& help, Kind kind,
                    const Labels& labels) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rl
