#include "services/router/state/fleet_record.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace rl::router {
namespace {

constexpr const char* kWeightsKey = "fleet.weights";          // "VERSION SOURCE PATH"
constexpr const char* kChainKey = "fleet.weights.chain";      // "VERSION PATH" lines
constexpr const char* kPausedKey = "fleet.paused";            // "1" or "0"
constexpr const char* kAddedKey = "fleet.workers.added";      // addresses, one per line
constexpr const char* kRemovedKey = "fleet.workers.removed";  // addresses, one per line

std::set<std::string> SplitLines(const std::string& v) {
  std::set<std::string> out;
  for (absl::string_view a : absl::StrSplit(v, '\n', absl::SkipEmpty())) out.emplace(a);
  return out;
}

// The chain as OnFleetWeights wrote it: versions increasing, below the fleet's. A chain that
// does not read so (a crash between the two writes) is dropped: catch-up then falls back to a
// live peer when the fleet's folder is a delta of a version the worker does not hold.
std::vector<FleetWeights::DiskStep> ParseChain(const std::string& value, int64_t version) {
  std::vector<FleetWeights::DiskStep> chain;
  for (absl::string_view line : absl::StrSplit(value, '\n', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(' ', 1));
    FleetWeights::DiskStep step;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &step.version) || parts[1].empty() ||
        step.version >= version || (!chain.empty() && step.version <= chain.back().version) ||
        chain.size() >= FleetWeights::kMaxDiskChain) {
      spdlog::warn("fleet state: the disk chain '{}' does not fit weight_version {}; dropped",
                   value, version);
      return {};
    }
    step.path = parts[1];
    chain.push_back(std::move(step));
  }
  return chain;
}

}  // namespace

absl::Status FleetRecord::Restore(WorkerPool* pool) {
  const auto bad = [this](const char* key, const std::string& value) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fleet state in ", store_->path(), ": unreadable ", key, " '", value,
        "'; move the folder away to start without it (the fleet's version is then unknown)"));
  };
  absl::StatusOr<std::optional<std::string>> weights = store_->GetMeta(kWeightsKey);
  if (!weights.ok()) return weights.status();
  if (weights->has_value()) {
    const std::string& v = **weights;
    std::vector<std::string> parts = absl::StrSplit(v, absl::MaxSplits(' ', 2));
    FleetWeights fleet;
    int source = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &fleet.version) ||
        !absl::SimpleAtoi(parts[1], &source) || source < 0 ||
        source > static_cast<int>(FleetWeights::Source::kAdopted)) {
      return bad(kWeightsKey, v);
    }
    fleet.source = static_cast<FleetWeights::Source>(source);
    fleet.path = parts[2];
    absl::StatusOr<std::optional<std::string>> chain = store_->GetMeta(kChainKey);
    if (!chain.ok()) return chain.status();
    if (chain->has_value() && fleet.source == FleetWeights::Source::kDisk) {
      fleet.chain = ParseChain(**chain, fleet.version);
    }
    spdlog::info("fleet state restored: weight_version {} from {}", fleet.version,
                 fleet.Describe());
    pool->SetFleetWeights(fleet);
  }
  absl::StatusOr<std::optional<std::string>> paused = store_->GetMeta(kPausedKey);
  if (!paused.ok()) return paused.status();
  if (paused->has_value()) {
    if (**paused != "0" && **paused != "1") return bad(kPausedKey, **paused);
    if (**paused == "1") {
      spdlog::warn(
          "fleet state restored: the fleet is paused (a pause without its continue "
          "before the restart); requests queue on the workers until `rlctl continue`");
    }
    pool->SetFleetPaused(**paused == "1");
  }
  absl::StatusOr<std::optional<std::string>> added = store_->GetMeta(kAddedKey);
  if (!added.ok()) return added.status();
  absl::StatusOr<std::optional<std::string>> removed = store_->GetMeta(kRemovedKey);
  if (!removed.ok()) return removed.status();
  absl::MutexLock lock(&mu_);
  if (added->has_value()) added_ = SplitLines(**added);
  if (removed->has_value()) removed_ = SplitLines(**removed);
  if (!added_.empty() || !removed_.empty()) {
    spdlog::info("fleet state restored: workers added at run time [{}], removed [{}]",
                 absl::StrJoin(added_, ", "), absl::StrJoin(removed_, ", "));
  }
  return absl::OkStatus();
}

std::vector<std::string> FleetRecord::StartWorkers(const std::vector<std::string>& flags) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  const auto push = [&out](const std::string& a) {
    if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  };
  for (const std::string& a : flags) {
    if (!removed_.contains(a)) push(a);
  }
  for (const std::string& a : added_) push(a);
  return out;
}

absl::Status FleetRecord::PersistWorkersLocked() {
  StoreBatch batch;
  batch.meta.emplace_back(kAddedKey, absl::StrJoin(added_, "\n"));
  batch.meta.emplace_back(kRemovedKey, absl::StrJoin(removed_, "\n"));
  absl::Status s = store_->WaitDurable(store_->Enqueue(std::move(batch)));
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "the worker change is in effect but not yet persisted (the store writes it once it "
        "recovers; a restart before that forgets it): ",
        s.message()));
  }
  return absl::OkStatus();
}

absl::Status FleetRecord::RecordAdded(const std::string& address) {
  absl::MutexLock lock(&mu_);
  removed_.erase(address);
  added_.insert(address);
  return PersistWorkersLocked();
}

absl::Status FleetRecord::RecordRemoved(const std::string& address) {
  absl::MutexLock lock(&mu_);
  added_.erase(address);
  removed_.insert(address);
  return PersistWorkersLocked();
}

void FleetRecord::OnFleetWeights(const FleetWeights& /*before*/, const FleetWeights& after) {
  const std::string value =
      absl::StrCat(after.version, " ", static_cast<int>(after.source), " ", after.path);
  if (absl::Status s = store_->PutMeta(kWeightsKey, value); !s.ok()) {
    spdlog::error("fleet weights not persisted: {}", std::string(s.message()));
  }
  std::vector<std::string> lines;
  for (const FleetWeights::DiskStep& step : after.chain) {
    if (step.path.find('\n') != std::string::npos) {  // not representable: no chain
      lines.clear();
      break;
    }
    lines.push_back(absl::StrCat(step.version, " ", step.path));
  }
  if (absl::Status s = store_->PutMeta(kChainKey, absl::StrJoin(lines, "\n")); !s.ok()) {
    spdlog::error("fleet weights' disk chain not persisted: {}", std::string(s.message()));
  }
}

void FleetRecord::OnFleetPaused(bool paused) {
  if (absl::Status s = store_->PutMeta(kPausedKey, paused ? "1" : "0"); !s.ok()) {
    spdlog::error("fleet pause state not persisted: {}", std::string(s.message()));
  }
}

}  // namespace rl::router
