// WeightUpdateController: the worker's WeightUpdates (weight_updates.h), composed of the update
// lifecycle (update_lifecycle.h), the weight-update groups (update_groups.h), the two-phase
// receive (staged_receive.h) and validation (update_validation.h). The composition root
// (WorkerServer) builds it over the engine; AdminService calls it; the control plane reads its
// state. Semantics of every call: docs/weight-updates.md.
// Cost: the served weights' names and shapes are read once at Create; a prepared receive stages
// every tensor it lists in host memory until Complete; a staged version holds one host copy of
// the model until activated or dropped (a disk update holds one during its read); tensors applied
// from memory are hashed once, when that makes the served digest known (docs/weight-updates.md,
// "Checksums"): a staged version while it is staged, tensors copied into the served weights after
// the update answered, on the hashing thread (at --staging-nice; the digest is pending until it
// is done, and a later update drops a hash in progress), which holds the tensors until then; what
// an update replaced is freed after it answered, on the freeing thread (deferred_free.h).
// Thread-safe: any thread, concurrently; engine state is touched only on its thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/model_io/model_config.h"
#include "common/request_limits.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/model_runner.h"
#include "services/worker/model/sleepable_runner.h"
#include "services/worker/model/weights.h"
#include "services/worker/weight_sync/weight_sync.h"
#include "services/worker/weights/deferred_free.h"
#include "services/worker/weights/publication.h"
#include "services/worker/weights/update_groups.h"
#include "services/worker/weights/update_lifecycle.h"
#include "services/worker/weights/weight_updates.h"

namespace rl::worker {

class WeightUpdateController final : public WeightUpdates {
 public:
  struct Deps {
    engine::Engine* engine = nullptr;    // outlives the controller
    model_io::ModelConfig model_config;  // what a disk update must match
    RequestLimits limits;                // bounds on a disk update's files
    int cuda_device = 0;                 // nccl groups use it
    // The owner of the asleep state (model/sleepable_runner.h); null: never asleep.
    const model::SleepableRunner* sleep = nullptr;
    std::function<void()> updating_changed;       // updating() may have changed; may be empty
    std::function<void(double)> record_duration;  // an update's seconds; may be empty
    // A disk stage's read (checkpoint or delta, hashed and verified) runs on a thread this much
    // nicer than the caller (common/low_priority.h), so the engine keeps its core; 0: not.
    int staging_nice = 0;
    // Joins a group (InitWeightsUpdateGroup); empty: weight_sync::ConnectReceiver. Tests pass
    // fakes.
    std::function<absl::StatusOr<std::unique_ptr<weight_sync::WeightReceiver>>(
        const weight_sync::GroupOptions&)>
        connect;
    // Runs on the hashing thread before each served-digest job (tests hold a job with it); may
    // be empty.
    std::function<void()> before_digest;
  };
  // Reads the served weights' names and shapes once (the engine must be awake): they never
  // change, so checking a request against them never waits for the engine thread.
  static absl::StatusOr<std::unique_ptr<WeightUpdateController>> Create(Deps deps);
  // Shutdown().
  ~WeightUpdateController() override;
  WeightUpdateController(const WeightUpdateController&) = delete;
  WeightUpdateController& operator=(const WeightUpdateController&) = delete;

  // Closes every group (a receive in flight fails promptly), joins prepared receives and
  // forgets the groups. Idempotent; call before the engine goes.
  void Shutdown() { groups_.CloseAll(); }

  bool updating() const override { return lifecycle_.updating(); }
  // Weight applies started so far (update_lifecycle.h): the peer sender's change detector.
  uint64_t applies() const { return lifecycle_.applies(); }
  WeightUpdateStatus status() const override;
  std::string served_sha256() const override ABSL_LOCKS_EXCLUDED(digest_mu_);
  // The served digest is being computed (after an update that answered before hashing what it
  // applied): served_sha256() is "" until it is done.
  bool served_digest_pending() const ABSL_LOCKS_EXCLUDED(digest_mu_);
  // Waits until no served digest is being computed (the digest is then known or unknown; tests,
  // benchmarks).
  void WaitForServedDigest() { hasher_.Drain(); }
  // Bytes hashed for served or staged digests so far (tests: what was hashed twice).
  int64_t hashed_bytes() const { return hashed_bytes_.load(); }
  // Receives started so far (ReceiveStarts; tests).
  uint64_t receives_started() const { return receives_.load(); }
  const WeightShapes& served_shapes() const override { return served_shapes_; }
  // The served weights as read at Create (fixed for the life of the process).
  const std::vector<model::TensorInfo>& served_weights() const { return served_; }

  absl::StatusOr<AdminOutcome> UpdateWeightsFromDisk(const std::string& model_path,
                                                     const UpdatePolicy& policy) override;
  absl::StatusOr<AdminOutcome> UpdateWeightsFromTensors(std::vector<NamedTensor> tensors,
                                                        const UpdatePolicy& policy) override;
  absl::StatusOr<AdminOutcome> UpdateWeightsFromDistributed(const std::string& group_name,
                                                            std::vector<model::TensorInfo> specs,
                                                            const UpdatePolicy& policy) override;
  // Prepare validates `buckets` against the served weights and posts the receive; one
  // prepared receive per group at a time. A Complete that fails before applying (e.g. a bad
  // weight_version) keeps the prepared receive for a retry; one whose receive failed, or whose
  // tensors were refused, drops it (the error says which).
  absl::StatusOr<AdminOutcome> PrepareWeightsUpdate(const std::string& group_name,
                                                    WeightBuckets buckets) override;
  absl::StatusOr<AdminOutcome> CompleteWeightsUpdate(const std::string& group_name,
                                                     const UpdatePolicy& policy) override;
  absl::StatusOr<AdminOutcome> ReceiveWeights(const std::string& group_name, WeightBuckets buckets,
                                              const UpdatePolicy& policy) override;
  absl::StatusOr<AdminOutcome> InitWeightsUpdateGroup(const GroupRequest& request) override;
  absl::StatusOr<AdminOutcome> DestroyWeightsUpdateGroup(const std::string& group_name) override;
  absl::StatusOr<std::vector<model::TensorInfo>> ListWeights() override;
  absl::StatusOr<AdminOutcome> StageWeightsFromDisk(const std::string& model_path,
                                                    std::optional<int64_t> weight_version) override;
  absl::StatusOr<AdminOutcome> ActivateStagedWeights(const UpdatePolicy& policy) override;
  absl::StatusOr<AdminOutcome> DropStagedWeights() override;
  absl::StatusOr<std::unique_ptr<StageTicket>> BeginStage(
      const std::string& source, std::optional<int64_t> weight_version) override;
  absl::StatusOr<AdminOutcome> CompleteWeightsUpdateStaged(
      const std::string& group_name, std::optional<int64_t> weight_version) override;
  absl::StatusOr<AdminOutcome> ReceiveWeightsStaged(const std::string& group_name,
                                                    WeightBuckets buckets,
                                                    std::optional<int64_t> weight_version) override;
  absl::Status CheckDeltaParent(int64_t parent_version) const override;
  absl::StatusOr<AdminOutcome> UpdateWeightsFromDelta(DeltaUpdate update,
                                                      const UpdatePolicy& policy) override;
  absl::StatusOr<AdminOutcome> ReceiveDeltaWeights(const std::string& group_name,
                                                   WeightBuckets buckets, GroupDelta delta,
                                                   const UpdatePolicy& policy, bool stage) override;
  absl::StatusOr<AdminOutcome> PrepareDeltaWeightsUpdate(const std::string& group_name,
                                                         WeightBuckets buckets,
                                                         GroupDelta delta) override;

 private:
  // Prepare{,Delta}WeightsUpdate once the request passed its checks: claims the group and posts
  // the receive.
  absl::StatusOr<AdminOutcome> PostPrepared(const std::string& group_name, WeightBuckets buckets,
                                            std::optional<GroupDelta> delta);
  // Complete{,Staged} of a prepared delta receive that arrived whole (claim.prepared()): builds
  // it through UpdateWeightsFromDelta, or stages it (BeginStage + CommitDelta). A refusal before
  // the data is used (a bad weight_version, asleep, another stage in progress) keeps the prepared
  // receive for a retry; any later one drops it.
  absl::StatusOr<AdminOutcome> CompletePreparedDelta(const std::string& group_name,
                                                     UpdateGroups::Claim& claim,
                                                     const UpdatePolicy& policy, bool stage);
  // A version read or received ahead into owned host memory, waiting for its activation: a
  // checkpoint (`weights`, from disk) or tensors (a tensor stream or a group receive; activated by
  // copying them into the served weights).
  struct StagedVersion {
    std::optional<int64_t> version;
    std::string source;    // "disk:DIR", "tensor", "group:NAME"
    std::string path;      // disk only
    std::string identity;  // model::FolderIdentity of `path` before the read ("" unknown)
    std::unique_ptr<model::Weights> weights;
    std::vector<NamedTensor> tensors;
    int64_t bytes = 0;
    // Publications (publication.h): the verified manifest's digest ("" without one) and the
    // folder the runner may reload the version from ("" when built from a delta).
    std::string manifest_sha256;
    std::string reload_path;
    // A delta's parent (reported), and the version a stage built on a copy of the served weights
    // was built on (activation refuses it unless that version is still served).
    std::optional<int64_t> delta_parent;
    std::optional<int64_t> built_on;
    // Per-tensor digests (weights_checker.h TensorDigest) of a full version (its manifest's) or
    // of the staged tensors (computed while staging); empty when unknown.
    std::map<std::string, std::string> tensor_sha256;
    // Staged tensors of every served weight: their rank digest, computed while staging (reported
    // as the staged digest when there is no manifest); "" otherwise.
    std::string computed_sha256;
    // `weights` are staged tensors of every served weight (AsFullWeights), not a folder or a
    // delta: swapped in like a checkpoint, or copied in tensor by tensor while asleep.
    bool from_tensors = false;
  };
  // Tensors (validated against the served weights) that are every served weight in its held
  // dtype, as Weights over their own buffers (no copy; `*tensors` is emptied); nullptr, with
  // `*tensors` untouched, otherwise.
  std::unique_ptr<model::Weights> AsFullWeights(std::vector<NamedTensor>* tensors) const;
  // Copies every tensor of `weights` into the runner (UpdateWeight): a full version while
  // asleep, where nothing can be swapped.
  static absl::Status CopyWeightsIn(model::ModelRunner& runner, const model::Weights& weights);
  // Whether `digests` names every served tensor (a full state).
  bool CoversServed(const std::map<std::string, std::string>& digests) const;

  // StageTicket::CommitDelta of BeginStage.
  absl::StatusOr<AdminOutcome> CommitDeltaStage(const std::string& source,
                                                std::optional<int64_t> weight_version,
                                                std::chrono::steady_clock::time_point start,
                                                DeltaUpdate update);
  // A DeltaUpdate built on a copy of the served weights and verified (publication.h), with the
  // version it will serve as (`weight_version` and the manifest's must agree).
  absl::StatusOr<ReadVersion> BuildDelta(const std::string& what, const DeltaUpdate& update,
                                         std::optional<int64_t> weight_version);

  // StageTicket::Commit of BeginStage; `digests` the tensors' TensorDigests when known (else
  // computed here).
  absl::StatusOr<AdminOutcome> CommitStage(const std::string& source,
                                           std::optional<int64_t> weight_version,
                                           std::chrono::steady_clock::time_point start,
                                           std::vector<NamedTensor> tensors,
                                           std::map<std::string, std::string> digests);

  explicit WeightUpdateController(Deps deps);
  // From an apply step (engine thread, after the apply succeeded): the weights it installed
  // digest to `sha256` ("" unknown), with these per-tensor digests (empty: unknown); valid until
  // the next apply starts. A served digest still pending for an earlier apply is dropped.
  void NoteServedDigest(const std::string& sha256, std::map<std::string, std::string> tensors = {})
      ABSL_LOCKS_EXCLUDED(digest_mu_);
  // After apply number `apply` (UpdateLifecycle::applies, read in its apply step) replaced the
  // tensors `updated` (name -> digest) and nothing else: the served digest is the one before it
  // with those replaced, when the one before was known (the previous apply's, per tensor), or
  // `updated`'s alone when it names every served tensor; else unknown. Any thread.
  void NoteTensorsApplied(uint64_t apply, const std::map<std::string, std::string>& updated)
      ABSL_LOCKS_EXCLUDED(digest_mu_);
  // After apply number `apply` (read in its apply step) copied `tensors` into the served weights
  // and answered: when their digests would make the served digest known (the per-tensor digests
  // of the apply before are known, or `tensors` may be every served weight), the digest is
  // pending and the tensors are hashed on the hashing thread, which then publishes it
  // (NoteTensorsApplied) unless another apply started meanwhile (the hash stops and is dropped);
  // else it is unknown. Takes `tensors` (freed on the hashing or the freeing thread). Any thread.
  void DigestAfterAnswer(uint64_t apply, std::vector<NamedTensor> tensors)
      ABSL_LOCKS_EXCLUDED(digest_mu_);
  // A receive (group claim, stage, disk read) starts: a served-digest hash in progress stops and
  // the tensors it holds are freed before this returns (at most one tensor's hash later).
  void ReceiveStarts();
  // TensorDigest of every tensor, at the staging priority (SHA-256: ~1.5 GB/s).
  std::map<std::string, std::string> DigestTensors(const std::vector<NamedTensor>& tensors);
  // Checks every bucket against the served weights, then claims the group.
  absl::StatusOr<UpdateGroups::Claim> CheckAndClaim(const std::string& group_name,
                                                    const WeightBuckets& buckets,
                                                    UpdateGroups::ClaimFor what);
  // Reads a publication folder (checkpoint or delta, verified against its manifest) off the
  // engine thread: publication.h.
  absl::StatusOr<ReadVersion> ReadFolder(const std::string& model_path,
                                         std::optional<int64_t> weight_version);
  // Uploads weights read ahead into the runner's second device copy (CUDA,
  // model/staged_mirror.h), 64 MiB per engine-thread hop so decoding goes on between slices;
  // returns what happened for the answer ("" on a backend without device memory).
  std::string StageOnDevice(const model::Weights& weights);

  const Deps deps_;
  // Frees replaced weights and applied staged tensors after the call answered (deferred_free.h).
  DeferredFree reaper_;
  bool device_backend_ = false;  // the runner serves from device memory (CUDA): StageOnDevice
  std::vector<model::TensorInfo> served_;
  WeightShapes served_shapes_;
  UpdateLifecycle lifecycle_;
  UpdateGroups groups_;
  VersionLedger ledger_;  // version -> manifest digest of the versions served here
  // The served weights' digest and the apply (UpdateLifecycle::applies) that installed them.
  // While `digest_pending_`, a job on hasher_ computes the digest of apply `digest_applies_`;
  // `digest_tensors_` are then the per-tensor digests it builds on (the apply before's; empty:
  // none). A job publishes only while `digest_applies_` and the applies started are still its.
  mutable absl::Mutex digest_mu_;
  uint64_t digest_applies_ ABSL_GUARDED_BY(digest_mu_) = 0;
  bool digest_pending_ ABSL_GUARDED_BY(digest_mu_) = false;
  std::string digest_ ABSL_GUARDED_BY(digest_mu_);
  std::map<std::string, std::string> digest_tensors_ ABSL_GUARDED_BY(digest_mu_);  // per tensor
  std::atomic<int64_t> hashed_bytes_{0};
  // Receives started (group claims, stages, disk reads): a served-digest hash posted before the
  // latest one stops (ReceiveStarts).
  std::atomic<uint64_t> receives_{0};
  mutable absl::Mutex stage_mu_;
  bool staging_ ABSL_GUARDED_BY(stage_mu_) = false;
  std::unique_ptr<StagedVersion> staged_ ABSL_GUARDED_BY(stage_mu_);
  // Set by the destructor: a hash in progress stops.
  std::atomic<bool> stopping_{false};
  // Hashes applied tensors after the answer (DigestAfterAnswer), at --staging-nice. Declared
  // last: destroyed (its jobs stopped and joined) before the state they read.
  DeferredFree hasher_;
};

}  // namespace rl::worker
