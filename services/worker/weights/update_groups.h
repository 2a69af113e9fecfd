// UpdateGroups: the worker's weight-update groups (joined by InitWeightsUpdateGroup) and who may
// receive on each: one receive at a time per group.
//
// Design: a call that receives on a group (a per-bucket distributed update, ReceiveWeights,
// PrepareWeightsUpdate while it posts, CompleteWeightsUpdate while it waits and applies) takes a
// Claim on it; a second call on a claimed group, or a receive on a group with a prepared update,
// gets FAILED_PRECONDITION naming the group. A prepared update (StagedReceive) is parked on its
// group between Prepare and Complete. Leave (DestroyWeightsUpdateGroup) never waits for a claim:
// it closes the group's receiver (a receive in flight fails promptly), then joins a parked
// receive. Receivers are shared, so a claim keeps its own reference while a Leave closes it.
// Cost: one map entry and one transport connection per group.
// Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/worker/weight_sync/weight_sync.h"
#include "services/worker/weights/staged_receive.h"

namespace rl::worker {

class UpdateGroups {
  struct Group;

 public:
  // What a call claims a group for: a receive needs no prepared update on the group, nor does a
  // Prepare; a Complete takes the prepared update into its claim.
  enum class ClaimFor { kReceive, kPrepare, kComplete };

  // A group claimed by one call; the group is free again when the claim goes. For a Complete it
  // also holds the prepared update, taken off the group.
  class Claim {
   public:
    Claim(Claim&& other) noexcept = default;
    Claim& operator=(Claim&&) = delete;
    ~Claim();

    weight_sync::WeightReceiver* receiver() const { return receiver_.get(); }
    const std::shared_ptr<weight_sync::WeightReceiver>& shared_receiver() const {
      return receiver_;
    }
    StagedReceive* prepared() const { return prepared_.get(); }

   private:
    friend class UpdateGroups;
    Claim(UpdateGroups* owner, std::shared_ptr<Group> group,
          std::shared_ptr<weight_sync::WeightReceiver> receiver,
          std::unique_ptr<StagedReceive> prepared)
        : owner_(owner),
          group_(std::move(group)),
          receiver_(std::move(receiver)),
          prepared_(std::move(prepared)) {}

    UpdateGroups* owner_;
    std::shared_ptr<Group> group_;
    std::shared_ptr<weight_sync::WeightReceiver> receiver_;
    std::unique_ptr<StagedReceive> prepared_;
  };

  UpdateGroups() = default;
  // CloseAll().
  ~UpdateGroups();
  UpdateGroups(const UpdateGroups&) = delete;
  UpdateGroups& operator=(const UpdateGroups&) = delete;

  bool Contains(const std::string& name) const;
  // Adds a joined group; ALREADY_EXISTS (the receiver closed) when the name is taken.
  absl::Status Join(const std::string& name, std::unique_ptr<weight_sync::WeightReceiver> receiver);
  // Closes and forgets the group, joining its prepared receive; NOT_FOUND when there is none.
  absl::Status Leave(const std::string& name);
  // Closes every group (a receive in flight fails promptly), joins prepared receives and forgets
  // the groups. Idempotent.
  void CloseAll();
  std::vector<std::string> names() const;  // sorted

  // Claims `name` for the caller: FAILED_PRECONDITION naming the group when it does not exist,
  // is claimed, or has (lacks, for kComplete) a prepared update.
  absl::StatusOr<Claim> Take(const std::string& name, ClaimFor what);
  // Parks `prepared` on the claimed group. False (`prepared` left to the caller) when the group
  // was left or closed meanwhile.
  bool Park(const std::string& name, const Claim& claim, std::unique_ptr<StagedReceive>& prepared);
  // Parks the claim's prepared update back on its group (a Complete that applied nothing).
  // False when the group was left meanwhile.
  bool GiveBack(const std::string& name, Claim& claim);

 private:
  struct Group {
    std::shared_ptr<weight_sync::WeightReceiver> receiver;
    bool busy = false;  // claimed
    std::unique_ptr<StagedReceive> prepared;
  };
  // Whether `group` is still joined under `name` (not left or closed meanwhile).
  bool Joined(const std::string& name, const std::shared_ptr<Group>& group) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rl::worker
