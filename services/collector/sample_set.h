// A set of SampleKeys stored as runs of consecutive prompt indices per sample number, so the
// collector's checkpoint costs memory and encoding time in proportion to its runs, not to the
// samples done (a collection saved in order is one run per sample number).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "absl/container/btree_map.h"
#include "services/collector/sample.h"

namespace rl::collector {

class SampleSet {
 public:
  SampleSet() = default;
  SampleSet(std::initializer_list<SampleKey> keys) {
    for (const SampleKey& k : keys) insert(k);
  }

  bool contains(const SampleKey& k) const;
  // Both keep the runs maximal: neighbouring runs are joined, a run is split around an erase.
  void insert(const SampleKey& k) { InsertRun(k.index, k.index, k.sample); }
  void erase(const SampleKey& k);
  // Adds [first, last] (first <= last) for `sample`; overlaps with what is there are fine.
  void InsertRun(int64_t first, int64_t last, int32_t sample);

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  // Calls f(first, last, sample) for each run, by sample number, then index.
  template <typename F>
  void ForEachRun(F&& f) const {
    for (const auto& [sample, runs] : runs_) {
      for (const auto& [first, last] : runs) f(first, last, sample);
    }
  }

  friend bool operator==(const SampleSet& a, const SampleSet& b) {
    return a.size_ == b.size_ && a.runs_ == b.runs_;
  }

 private:
  using Runs = absl::btree_map<int64_t, int64_t>;  // first -> last, disjoint, not adjacent
  absl::btree_map<int32_t, Runs> runs_;
  size_t size_ = 0;
};

}  // namespace rl::collector
