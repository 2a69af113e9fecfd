#include "services/router/state/fleet_record.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace rl::router {
namespace {

constexpr const char* kWeightsKey = "fleet.weights";  // "VERSION SOURCE PATH"
constexpr const char* kPausedKey = "fleet.paused";    // "1" or "0"

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
        source > static_cast<int>(FleetWeights::Source::kDistributed)) {
      return bad(kWeightsKey, v);
    }
    fleet.source = static_cast<FleetWeights::Source>(source);
    fleet.path = parts[2];
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
  return absl::OkStatus();
}

void FleetRecord::OnFleetWeights(const FleetWeights& /*before*/, const FleetWeights& after) {
  const std::string value =
      absl::StrCat(after.version, " ", static_cast<int>(after.source), " ", after.path);
  if (absl::Status s = store_->PutMeta(kWeightsKey, value); !s.ok()) {
    spdlog::error("fleet weights not persisted: {}", std::string(s.message()));
  }
}

void FleetRecord::OnFleetPaused(bool paused) {
  if (absl::Status s = store_->PutMeta(kPausedKey, paused ? "1" : "0"); !s.ok()) {
    spdlog::error("fleet pause state not persisted: {}", std::string(s.message()));
  }
}

}  // namespace rl::router
