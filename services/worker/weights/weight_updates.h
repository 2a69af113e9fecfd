// WeightUpdates: the worker's weight-update unit as the services see it. Every way new weights
// arrive (a checkpoint folder, a tensor stream, a weight-update group's broadcast, one call or
// two-phase), the groups themselves, and what the unit reports (updating, the last failure,
// the served weights' names and shapes). WeightUpdateController implements it; AdminService
// translates protos to it, and the control plane reads its state.
//
// Design: every update goes through one lifecycle on the engine thread (refuse or retract →
// abort if asked → apply → flush the prefix cache → bump weight_version → resume unless
// keep_pause); the semantics, including updates while asleep and the group claims, are in
// docs/weight-updates.md. Staged versions (stage while serving, then a short activate) are
// calls of this interface too: the unit owns the served version and what is staged.
// Thread-safety: every call may come from any thread, concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/weight_sync/delta_file.h"
#include "common/weight_sync/manifest.h"
#include "services/worker/model/model_runner.h"

namespace rl::worker {

// What an admin call did (weight updates and the control plane's calls alike).
struct AdminOutcome {
  std::string message;
  int32_t num_aborted = 0;
  int64_t weight_version = 0;
  int64_t duration_us = 0;
  bool ready = false;  // PrepareWeightsUpdate: the receive is posted
  // PauseGeneration(drain): engine/engine.h DrainResult.
  bool drained = false;
  int32_t num_still_active = 0;
  std::vector<std::string> still_active_ids;
  int32_t num_held = 0;
  // An update with keep_kv: the running requests that kept their KV.
  int32_t num_kept_kv = 0;
};

// How an update treats the engine. There is no flush_cache: every update flushes the prefix
// cache (KV computed with the old weights is never reused), so the requests' flush_cache field
// is ignored, by design (README "Semantics worth knowing").
struct UpdatePolicy {
  std::optional<int64_t> weight_version;  // unset: current + 1
  bool abort_all_requests = false;
  bool keep_pause = false;
  // In-flight update (issue 34): running requests keep their KV (computed by the old weights)
  // and go on with the new ones; no retract, no recompute. Allowed while requests run or the
  // engine is paused in place. Unlocked prefix-cache entries are evicted instead of a flush.
  bool keep_kv = false;
  // The tensors were verified to be the whole served state with this rank digest
  // (TensorStreamEnd.rank_sha256): the served weights' digest once applied (GetLoad), with the
  // per-tensor digests the check computed (name -> digest; the base of a later partial update's
  // digest; empty: not known).
  std::string verified_sha256;
  std::map<std::string, std::string> verified_tensor_sha256;
};

// One tensor of an UpdateWeightsFromTensor stream, assembled.
struct NamedTensor {
  model::TensorInfo info;
  std::vector<uint8_t> bytes;
};

// The buckets of a receive: each bucket is one broadcast of the listed tensors, in order.
using WeightBuckets = std::vector<std::vector<model::TensorInfo>>;

// A delta update (issue 30; docs/weight-publications.md), from a tensor stream or a group
// receive: per-tensor delta payloads (common/weight_sync/delta.h, the weights.rldelta encodings)
// and whole tensors, applied to a copy of the served weights; a tensor named by neither is
// unchanged. `parent_version` must be the served version (else FAILED_PRECONDITION naming both);
// unset: the copy is of whatever is served (a dense stream carrying a manifest). With `manifest`,
// the result is verified against it (every tensor's digest) before it is applied or staged.
struct DeltaUpdate {
  std::optional<int64_t> parent_version;
  std::optional<weight_sync::Manifest> manifest;
  std::vector<weight_sync::NamedDelta> deltas;
  std::vector<NamedTensor> dense;
};

// A delta group receive: the tensors the buckets carry encoded (name -> encoding, count and
// payload bytes; broadcast as U8[payload_bytes]); the others are whole tensors.
struct EncodedTensor {
  weight_sync::DeltaEncoding encoding = weight_sync::DeltaEncoding::kOverwrite;
  int64_t count = 0;
  int64_t payload_bytes = 0;
};
struct GroupDelta {
  int64_t parent_version = 0;
  std::optional<weight_sync::Manifest> manifest;
  std::map<std::string, EncodedTensor> encoded;
};

struct GroupRequest {
  std::string master_address;
  int master_port = 0;
  int rank_offset = 0;
  int world_size = 0;
  std::string group_name;
  std::string backend;  // "tcp" | "nccl" | "" (auto)
  int timeout_ms = 60000;
};

// The staged version, if any (StageWeightsFromDisk, a staged tensor stream or group receive),
// as GetServerInfo reports it.
struct StagedStatus {
  bool has_staged = false;
  int64_t version = -1;  // -1: current + 1 at activation
  std::string source;    // "disk:DIR", "tensor", "group:NAME"
  int64_t bytes = 0;     // host memory it holds
  bool staging = false;  // a stage is being read now
  // Its digest (its manifest's, or the one verified at staging), "" when unknown; the version a
  // staged delta was built on (-1: a full version).
  std::string sha256;
  int64_t parent_version = -1;
};

// A stage of tensors in progress (a staged tensor stream, a staged group receive), from
// BeginStage: while it is held the worker's one staged slot is taken (the previous staged version
// was freed, StagedStatus::staging is true, a second stage is FAILED_PRECONDITION). Commit makes
// the tensors the staged version once they are complete and verified; a ticket destroyed without
// Commit (the stream was cut, the receive failed) leaves nothing staged.
// Thread-safety: one owner; it must not outlive the WeightUpdates that made it.
class StageTicket {
 public:
  using CommitFn = std::function<absl::StatusOr<AdminOutcome>(std::vector<NamedTensor>,
                                                              std::map<std::string, std::string>)>;
  using CommitDeltaFn = std::function<absl::StatusOr<AdminOutcome>(DeltaUpdate)>;
  StageTicket(CommitFn commit, std::function<void()> abandon, CommitDeltaFn commit_delta = nullptr)
      : commit_(std::move(commit)),
        commit_delta_(std::move(commit_delta)),
        abandon_(std::move(abandon)) {}
  ~StageTicket() {
    if (abandon_) abandon_();
  }
  StageTicket(const StageTicket&) = delete;
  StageTicket& operator=(const StageTicket&) = delete;

  // Validates `tensors` against the served weights (names, dtypes, shapes, sizes; at least one)
  // and stages them; on error nothing is staged. `tensor_sha256`: their TensorDigests when the
  // caller computed them already (a verified full-state stream), so they are not hashed again;
  // empty: computed here. Once only.
  absl::StatusOr<AdminOutcome> Commit(std::vector<NamedTensor> tensors,
                                      std::map<std::string, std::string> tensor_sha256 = {}) {
    abandon_ = nullptr;
    CommitFn commit = std::move(commit_);
    commit_ = nullptr;
    commit_delta_ = nullptr;
    if (!commit) return absl::FailedPreconditionError("stage: committed twice");
    return commit(std::move(tensors), std::move(tensor_sha256));
  }
  // A delta (or a dense update verified against a manifest): built on a copy of the served
  // weights, verified, then staged (DeltaUpdate); on error nothing is staged. Once only.
  absl::StatusOr<AdminOutcome> CommitDelta(DeltaUpdate update) {
    abandon_ = nullptr;
    CommitDeltaFn commit = std::move(commit_delta_);
    commit_delta_ = nullptr;
    commit_ = nullptr;
    if (!commit) return absl::FailedPreconditionError("stage: committed twice, or no delta stage");
    return commit(std::move(update));
  }

 private:
  CommitFn commit_;
  CommitDeltaFn commit_delta_;
  std::function<void()> abandon_;
};

// What GetServerInfo reports of the updates.
struct WeightUpdateStatus {
  StagedStatus staged;
  // The last distributed update failed and left the engine paused (weights may be partial).
  bool update_failed = false;
  std::string last_error;
  std::vector<std::string> groups;  // names, sorted
};

// Name → shape of every served weight (fixed for the life of the process: updates never change
// the architecture).
using WeightShapes = std::map<std::string, std::vector<int64_t>>;

class WeightUpdates {
 public:
  virtual ~WeightUpdates() = default;

  // ---- state: never waits for the engine ----
  // An update holds (or is about to hold) the engine.
  virtual bool updating() const = 0;
  virtual WeightUpdateStatus status() const = 0;
  // The SHA-256 rank digest (rl-manifest.json's `sha256`) of the weights served now when an
  // update established it (a manifest-verified disk update, a verified full-state tensor
  // stream, tensors hashed while staged or after the update answered) and no apply started
  // since; "" otherwise, and while the hash of an update that answered first is still running
  // (pending). Never hashes anything.
  virtual std::string served_sha256() const { return ""; }
  // The served weights' shapes as read at start (what every update is checked against).
  virtual const WeightShapes& served_shapes() const = 0;

  // ---- updates (each returns once applied, or with why nothing or what was applied) ----
  virtual absl::StatusOr<AdminOutcome> UpdateWeightsFromDisk(const std::string& model_path,
                                                             const UpdatePolicy& policy) = 0;
  // Validates every tensor (name, dtype, shape, byte count) before changing any.
  virtual absl::StatusOr<AdminOutcome> UpdateWeightsFromTensors(std::vector<NamedTensor> tensors,
                                                                const UpdatePolicy& policy) = 0;
  // One bucket of a distributed update, received straight into the served weights.
  virtual absl::StatusOr<AdminOutcome> UpdateWeightsFromDistributed(
      const std::string& group_name, std::vector<model::TensorInfo> specs,
      const UpdatePolicy& policy) = 0;
  // Two-phase receive: Prepare posts the receive (answers ready once the first bucket's
  // receive is posted), Complete waits for it and applies everything atomically.
  virtual absl::StatusOr<AdminOutcome> PrepareWeightsUpdate(const std::string& group_name,
                                                            WeightBuckets buckets) = 0;
  virtual absl::StatusOr<AdminOutcome> CompleteWeightsUpdate(const std::string& group_name,
                                                             const UpdatePolicy& policy) = 0;
  // Single call: pause (retract) → receive `buckets` → apply atomically → resume.
  virtual absl::StatusOr<AdminOutcome> ReceiveWeights(const std::string& group_name,
                                                      WeightBuckets buckets,
                                                      const UpdatePolicy& policy) = 0;

  // ---- weight-update groups ----
  virtual absl::StatusOr<AdminOutcome> InitWeightsUpdateGroup(const GroupRequest& request) = 0;
  virtual absl::StatusOr<AdminOutcome> DestroyWeightsUpdateGroup(const std::string& group_name) = 0;

  // The served weights' names, dtypes and shapes (FAILED_PRECONDITION while asleep).
  virtual absl::StatusOr<std::vector<model::TensorInfo>> ListWeights() = 0;

  // ---- staged versions (docs/weight-updates.md, "Staged versions") ----
  // Reads `model_path` into host memory off the engine thread (the caller's), to serve later as
  // `weight_version` (unset: current + 1 at activation). One staged version at most: the old
  // one is freed before the read; a second stage while one is read is FAILED_PRECONDITION. A
  // failed read leaves nothing staged.
  virtual absl::StatusOr<AdminOutcome> StageWeightsFromDisk(const std::string& model_path,
                                                            std::optional<int64_t> weight_version) {
    return absl::UnimplementedError("StageWeightsFromDisk");
  }
  // Serves the staged version: a self-pausing update (running requests are retracted and go on
  // with the new weights, or aborted with abort_all_requests) whose apply is the swap.
  // policy.weight_version, when set, must equal the staged version's (when it has one).
  // FAILED_PRECONDITION when nothing is staged; a refusal before the swap keeps it staged.
  virtual absl::StatusOr<AdminOutcome> ActivateStagedWeights(const UpdatePolicy& policy) {
    return absl::UnimplementedError("ActivateStagedWeights");
  }
  // Frees the staged version (OK when there is none; FAILED_PRECONDITION while one is read).
  virtual absl::StatusOr<AdminOutcome> DropStagedWeights() {
    return absl::UnimplementedError("DropStagedWeights");
  }
  // Takes the staged slot for tensors from `source` ("tensor", "group:NAME") to serve as
  // `weight_version` (unset: current + 1 at activation): frees the staged version, refuses
  // (FAILED_PRECONDITION) while another stage is in progress. See StageTicket.
  virtual absl::StatusOr<std::unique_ptr<StageTicket>> BeginStage(
      const std::string& source, std::optional<int64_t> weight_version) {
    return absl::UnimplementedError("BeginStage");
  }
  // CompleteWeightsUpdate{stage}: waits for the prepared receive of `group_name`, then stages
  // its tensors instead of applying them (no pause). A stage refused before the data is taken
  // keeps the prepared receive for a retry.
  virtual absl::StatusOr<AdminOutcome> CompleteWeightsUpdateStaged(
      const std::string& group_name, std::optional<int64_t> weight_version) {
    return absl::UnimplementedError("CompleteWeightsUpdateStaged");
  }
  // ReceiveWeights{stage}: receives `buckets` on the group without pausing the engine (it keeps
  // generating) and stages them; a receive that fails or is cut leaves nothing staged.
  virtual absl::StatusOr<AdminOutcome> ReceiveWeightsStaged(const std::string& group_name,
                                                            WeightBuckets buckets,
                                                            std::optional<int64_t> weight_version) {
    return absl::UnimplementedError("ReceiveWeightsStaged");
  }

  // ---- deltas (issue 30: DeltaUpdate) ----
  // FAILED_PRECONDITION naming both versions unless `parent_version` is served now (a stream
  // checks it at its first message, before the payloads travel).
  virtual absl::Status CheckDeltaParent(int64_t parent_version) const {
    return absl::UnimplementedError("delta updates");
  }
  // One call: builds the new version on a copy of the served weights off the engine thread
  // (the engine keeps generating), verifies it, then activates it (the pause is the swap).
  virtual absl::StatusOr<AdminOutcome> UpdateWeightsFromDelta(DeltaUpdate update,
                                                              const UpdatePolicy& policy) {
    return absl::UnimplementedError("UpdateWeightsFromDelta");
  }
  // ReceiveWeights{parent_version}: receives `buckets` (the encoded tensors as their payloads)
  // off the engine thread, then applies the delta (UpdateWeightsFromDelta) or, with `stage`,
  // stages it; a receive that fails or is cut changes and stages nothing.
  virtual absl::StatusOr<AdminOutcome> ReceiveDeltaWeights(const std::string& group_name,
                                                           WeightBuckets buckets, GroupDelta delta,
                                                           const UpdatePolicy& policy, bool stage) {
    return absl::UnimplementedError("ReceiveDeltaWeights");
  }
  // PrepareWeightsUpdate{parent_version}: the checks of ReceiveDeltaWeights (the parent served,
  // the encodings bounded), then posts the receive of `buckets` (the encoded tensors as their
  // payloads) while the engine keeps generating. Complete (or Complete{stage}) then builds the
  // delta through the same path as ReceiveDeltaWeights: applied, or staged; nothing partial.
  virtual absl::StatusOr<AdminOutcome> PrepareDeltaWeightsUpdate(const std::string& group_name,
                                                                 WeightBuckets buckets,
                                                                 GroupDelta delta) {
    return absl::UnimplementedError("PrepareDeltaWeightsUpdate");
  }
};

}  // namespace rl::worker
