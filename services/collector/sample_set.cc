#include "services/collector/sample_set.h"

#include <algorithm>
#include <iterator>
#include <limits>

namespace rl::collector {
namespace {

// Whether a run ending at `last` overlaps or adjoins one starting at `first` (no overflow at
// the ends of the int64 line).
bool Touches(int64_t last, int64_t first) {
  return last >= first || (last < std::numeric_limits<int64_t>::max() && last + 1 == first);
}

size_t Count(int64_t first, int64_t last) {
  return static_cast<size_t>(static_cast<uint64_t>(last) - static_cast<uint64_t>(first)) + 1;
}

}  // namespace

bool SampleSet::contains(const SampleKey& k) const {
  auto rit = runs_.find(k.sample);
  if (rit == runs_.end()) return false;
  auto it = rit->second.upper_bound(k.index);
  if (it == rit->second.begin()) return false;
  return std::prev(it)->second >= k.index;
}

void SampleSet::InsertRun(int64_t first, int64_t last, int32_t sample) {
  Runs& runs = runs_[sample];
  int64_t lo = first, hi = last;
  auto it = runs.upper_bound(first);
  if (it != runs.begin() && Touches(std::prev(it)->second, first)) --it;
  while (it != runs.end() && Touches(hi, it->first)) {
    lo = std::min(lo, it->first);
    hi = std::max(hi, it->second);
    size_ -= Count(it->first, it->second);
    it = runs.erase(it);
  }
  runs.emplace(lo, hi);
  size_ += Count(lo, hi);
}

void SampleSet::erase(const SampleKey& k) {
  auto rit = runs_.find(k.sample);
  if (rit == runs_.end()) return;
  Runs& runs = rit->second;
  auto it = runs.upper_bound(k.index);
  if (it == runs.begin()) return;
  --it;
  if (it->second < k.index) return;
  const int64_t first = it->first, last = it->second;
  runs.erase(it);
  --size_;
  if (first < k.index) runs.emplace(first, k.index - 1);
  if (k.index < last) runs.emplace(k.index + 1, last);
  if (runs.empty()) runs_.erase(rit);
}

}  // namespace rl::collector
