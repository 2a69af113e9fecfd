#include "services/worker/weights/update_groups.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace rl::worker {

UpdateGroups::Claim::~Claim() {
  if (group_ == nullptr) return;  // moved from
  absl::MutexLock lock(&owner_->mu_);
  group_->busy = false;
}

UpdateGroups::~UpdateGroups() { CloseAll(); }

bool UpdateGroups::Contains(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  return groups_.contains(name);
}

absl::Status UpdateGroups::Join(const std::string& name,
                                std::unique_ptr<weight_sync::WeightReceiver> receiver) {
  auto group = std::make_shared<Group>();
  group->receiver = std::move(receiver);
  bool joined = false;
  {
    absl::MutexLock lock(&mu_);
    joined = groups_.emplace(name, group).second;
  }
  if (!joined) {  // a concurrent join of the same name won
    group->receiver->Close();
    return absl::AlreadyExistsError(absl::StrCat("group_name: '", name, "' already exists"));
  }
  return absl::OkStatus();
}

absl::Status UpdateGroups::Leave(const std::string& name) {
  std::shared_ptr<Group> group;
  std::unique_ptr<StagedReceive> prepared;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(name);
    if (it == groups_.end()) {
      return absl::NotFoundError(absl::StrCat("group_name: no group '", name, "'"));
    }
    group = std::move(it->second);
    groups_.erase(it);
    prepared = std::move(group->prepared);
  }
  group->receiver->Close();  // a receive in flight fails promptly
  prepared.reset();          // joins its thread
  return absl::OkStatus();
}

void UpdateGroups::CloseAll() {
  std::vector<std::shared_ptr<Group>> groups;
  std::vector<std::unique_ptr<StagedReceive>> prepared;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, group] : groups_) {
      groups.push_back(group);
      if (group->prepared) prepared.push_back(std::move(group->prepared));
    }
    groups_.clear();
  }
  for (const auto& group : groups) group->receiver->Close();  // posted receives fail now
  prepared.clear();                                           // joins their threads
}

std::vector<std::string> UpdateGroups::names() const {
  std::vector<std::string> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, group] : groups_) out.push_back(name);
  return out;
}

bool UpdateGroups::Joined(const std::string& name, const std::shared_ptr<Group>& group) const {
  auto it = groups_.find(name);
  return it != groups_.end() && it->second == group;
}

absl::StatusOr<UpdateGroups::Claim> UpdateGroups::Take(const std::string& name, ClaimFor what) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(name);
  if (what == ClaimFor::kComplete &&
      (it == groups_.end() || (!it->second->busy && it->second->prepared == nullptr))) {
    return absl::FailedPreconditionError(
        absl::StrCat("group '", name, "' has no prepared update (PrepareWeightsUpdate first)"));
  }
  if (it == groups_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("group_name: no group '", name, "' (InitWeightsUpdateGroup first)"));
  }
  Group& group = *it->second;
  if (group.busy) {
    return absl::FailedPreconditionError(
        absl::StrCat("group '", name,
                     "' is busy: another call is receiving or applying weights on it (one "
                     "receive per group at a time)"));
  }
  if (what != ClaimFor::kComplete && group.prepared != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("group '", name, "' ", what == ClaimFor::kPrepare ? "already " : "",
                     "has a prepared update (CompleteWeightsUpdate first)"));
  }
  group.busy = true;
  return Claim(this, it->second, group.receiver,
               what == ClaimFor::kComplete ? std::move(group.prepared) : nullptr);
}

bool UpdateGroups::Park(const std::string& name, const Claim& claim,
                        std::unique_ptr<StagedReceive>& prepared) {
  absl::MutexLock lock(&mu_);
  if (!Joined(name, claim.group_)) return false;
  claim.group_->prepared = std::move(prepared);
  return true;
}

bool UpdateGroups::GiveBack(const std::string& name, Claim& claim) {
  absl::MutexLock lock(&mu_);
  if (!Joined(name, claim.group_)) return false;
  claim.group_->prepared = std::move(claim.prepared_);
  return true;
}

}  // namespace rl::worker
