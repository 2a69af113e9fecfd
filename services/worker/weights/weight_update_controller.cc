#include "services/worker/weights/weight_update_controller.h"

#include <chrono>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/low_priority.h"
#include "common/model_io/dtype.h"
#include "common/status.h"
#include "services/worker/model/weights.h"
#include "services/worker/weights/staged_receive.h"
#include "services/worker/weights/update_validation.h"
#include "services/worker/weights/weights_checker.h"
#include "spdlog/spdlog.h"

namespace rl::worker {
namespace {

int64_t MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

// `status` with `note` appended to its message, same code.
absl::Status WithNote(const absl::Status& status, absl::string_view note) {
  return absl::Status(status.code(), absl::StrCat(status.message(), "; ", note));
}

// A Complete whose prepared receive failed changed nothing: FAILED_PRECONDITION (the router then
// knows the worker's weights are whole), the receive's own code and message kept in the text.
absl::Status PreparedReceiveFailed(const absl::Status& received, absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": ", absl::StatusCodeToString(received.code()), ": ", received.message()));
}

WeightUpdateController::Deps WithDefaults(WeightUpdateController::Deps deps) {
  if (!deps.connect) deps.connect = weight_sync::ConnectReceiver;
  return deps;
}

using ClaimFor = UpdateGroups::ClaimFor;

}  // namespace

WeightUpdateController::WeightUpdateController(Deps deps)
    : deps_(WithDefaults(std::move(deps))),
      reaper_(deps_.staging_nice),
      lifecycle_({.engine = deps_.engine,
                  .sleep = deps_.sleep,
                  .updating_changed = deps_.updating_changed,
                  .record_duration = deps_.record_duration}),
      hasher_(deps_.staging_nice) {}

absl::StatusOr<std::unique_ptr<WeightUpdateController>> WeightUpdateController::Create(Deps deps) {
  std::unique_ptr<WeightUpdateController> c(new WeightUpdateController(std::move(deps)));
  ASSIGN_OR_RETURN(c->served_, c->ListWeights());
  RETURN_IF_ERROR(c->deps_.engine->RunOnEngineThread([&](engine::EngineContext& ctx) {
    c->device_backend_ = ctx.runner().backend_name() == "cuda";
    return absl::OkStatus();
  }));
  for (const model::TensorInfo& t : c->served_) c->served_shapes_[t.name] = t.shape;
  return c;
}

WeightUpdateController::~WeightUpdateController() {
  stopping_.store(true);  // a hash in progress stops; hasher_ is joined first (declared last)
  Shutdown();
}

WeightUpdateStatus WeightUpdateController::status() const {
  WeightUpdateStatus out;
  lifecycle_.FillStatus(&out);
  out.groups = groups_.names();
  absl::MutexLock lock(&stage_mu_);
  out.staged.staging = staging_;
  if (staged_ != nullptr) {
    out.staged.has_staged = true;
    out.staged.version = staged_->version.value_or(-1);
    out.staged.source = staged_->source;
    out.staged.bytes = staged_->bytes;
    out.staged.sha256 =
        staged_->manifest_sha256.empty() ? staged_->computed_sha256 : staged_->manifest_sha256;
    out.staged.parent_version = staged_->delta_parent.value_or(-1);
  }
  return out;
}

absl::StatusOr<UpdateGroups::Claim> WeightUpdateController::CheckAndClaim(
    const std::string& group_name, const WeightBuckets& buckets, ClaimFor what) {
  if (buckets.empty()) return absl::InvalidArgumentError("buckets: no bucket listed");
  std::vector<const model::TensorInfo*> infos;
  for (const auto& bucket : buckets) {
    if (bucket.empty()) return absl::InvalidArgumentError("buckets: an empty bucket");
    for (const auto& s : bucket) infos.push_back(&s);
  }
  RETURN_IF_ERROR(ValidateTensors(served_, infos, std::vector<int64_t>(infos.size(), -1)));
  absl::StatusOr<UpdateGroups::Claim> claim = groups_.Take(group_name, what);
  if (claim.ok()) ReceiveStarts();
  return claim;
}

void WeightUpdateController::ReceiveStarts() {
  // A served-digest hash still running holds the tensors an earlier update received: it stops
  // at its next tensor (DigestAfterAnswer) and they are freed (the hashing thread's Drain, as a
  // stage drains the freeing thread) before this receive fills its own buffers.
  receives_.fetch_add(1);
  hasher_.Drain();
}

absl::StatusOr<ReadVersion> WeightUpdateController::ReadFolder(
    const std::string& model_path, std::optional<int64_t> weight_version) {
  ReceiveStarts();
  auto read = [&] {
    return ReadPublication(model_path, weight_version,
                           {.engine = deps_.engine,
                            .model_config = deps_.model_config,
                            .limits = deps_.limits,
                            .ledger = &ledger_});
  };
  if (deps_.staging_nice <= 0) return read();
  return RunAtLowPriority(deps_.staging_nice, read);
}

std::string WeightUpdateController::StageOnDevice(const model::Weights& weights) {
  if (!device_backend_) return "";
  constexpr int64_t kSliceBytes = int64_t{64} << 20;  // a few ms of host-to-device copy
  model::DeviceStageStep step;
  do {
    const absl::Status s =
        deps_.engine->RunOnEngineThread([&](engine::EngineContext& ctx) -> absl::Status {
          ASSIGN_OR_RETURN(step, ctx.runner().StageOnDevice(weights, kSliceBytes));
          return absl::OkStatus();
        });
    if (!s.ok()) {
      step.note = absl::StrCat(
          "staged in host memory (copied to the device at activation): the device copy failed: ",
          s.message());
      break;
    }
  } while (!step.done);
  spdlog::info("{}", step.note);
  return step.note;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::UpdateWeightsFromDisk(
    const std::string& model_path, const UpdatePolicy& policy) {
  if (policy.weight_version.has_value() && *policy.weight_version < 0) {
    return absl::InvalidArgumentError("weight_version: must be >= 0");
  }
  if (lifecycle_.asleep()) {
    RETURN_IF_ERROR(CheckDiskUpdate(model_path, deps_.model_config, deps_.limits));
    // Asleep: the sleepable runner checks the folder and stages it for the wake.
    return lifecycle_.Run("update_weights_from_disk", policy,
                          [&](model::ModelRunner& runner) {
                            return Annotate(runner.LoadWeightsFromDisk(model_path), model_path);
                          },
                          {});
  }
  // Stage + activate in one call: the read (a checkpoint, or a delta applied to a copy of the
  // served weights; verified against its manifest) runs here, off the engine thread, while it
  // keeps generating; the engine pauses only for the swap and the flush. The staged slot is not
  // touched (a version staged by StageWeights stays staged). The folder is checked (path length
  // and shape) before it is read or named in an answer, as for a stage.
  if (!IsDeltaOnlyFolder(model_path)) {
    RETURN_IF_ERROR(CheckDiskUpdate(model_path, deps_.model_config, deps_.limits));
  }
  reaper_.Drain();  // what an earlier update replaced is gone before this read allocates
  absl::StatusOr<ReadVersion> fresh = ReadFolder(model_path, policy.weight_version);
  if (!fresh.ok()) {
    return Annotate(fresh.status(),
                    absl::StrCat("update_weights_from_disk: ", model_path,
                                 " (nothing was applied; the old weights keep serving)"));
  }
  StageOnDevice(*fresh->weights);  // CUDA: the swap below is then a device-to-device copy
  UpdatePolicy p = policy;
  if (fresh->version.has_value()) p.weight_version = fresh->version;
  absl::StatusOr<AdminOutcome> out = lifecycle_.Run(
      "update_weights_from_disk", p,
      [&](model::ModelRunner& runner) {
        RETURN_IF_ERROR(
            Annotate(runner.ActivateWeights(&fresh->weights, fresh->reload_path, fresh->identity),
                     model_path));
        NoteServedDigest(fresh->manifest_sha256, std::move(fresh->tensor_sha256));
        return absl::OkStatus();
      },
      {});
  if (out.ok() && !fresh->manifest_sha256.empty()) {
    ledger_.Record(out->weight_version, fresh->manifest_sha256);
  }
  reaper_.Free(std::move(fresh->weights));  // the weights served before, after the answer
  return out;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::StageWeightsFromDisk(
    const std::string& model_path, std::optional<int64_t> weight_version) {
  if (weight_version.has_value() && *weight_version < 0) {
    return absl::InvalidArgumentError("weight_version: must be >= 0");
  }
  if (!IsDeltaOnlyFolder(model_path)) {
    RETURN_IF_ERROR(CheckDiskUpdate(model_path, deps_.model_config, deps_.limits));
  }
  const auto start = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&stage_mu_);
    if (staging_) {
      return absl::FailedPreconditionError(
          "stage_weights: another stage is being read (one staged version per worker); wait for "
          "its answer");
    }
    staging_ = true;
    reaper_.Free(std::move(staged_));  // one staged version at most: the old one goes ...
  }
  reaper_.Drain();  // ... before the new read, as does what an earlier update replaced
  // Off the engine thread: it keeps generating with the served weights meanwhile. Non-finite
  // values are refused while the files are read (model_io) or the delta applied, unless
  // --allow-non-finite-weights. A folder with a manifest is verified against it (publication.h).
  absl::StatusOr<ReadVersion> read = ReadFolder(model_path, weight_version);
  // CUDA: uploaded into a second device copy while serving, when memory allows (still staging).
  const std::string device_note = read.ok() ? StageOnDevice(*read->weights) : "";
  absl::MutexLock lock(&stage_mu_);
  staging_ = false;
  if (!read.ok()) {
    lifecycle_.RecordError(std::string(read.status().message()));
    return Annotate(read.status(),
                    absl::StrCat("stage_weights: ", model_path, " (nothing is staged)"));
  }
  auto staged = std::make_unique<StagedVersion>();
  staged->version = read->version;
  staged->source = absl::StrCat("disk:", model_path);
  staged->path = model_path;
  staged->identity = std::move(read->identity);
  staged->reload_path = std::move(read->reload_path);
  staged->manifest_sha256 = read->manifest_sha256;
  staged->tensor_sha256 = std::move(read->tensor_sha256);
  staged->delta_parent = read->delta_parent;
  staged->built_on = read->built_on;
  staged->bytes = read->weights->TotalBytes();
  staged->weights = std::move(read->weights);
  AdminOutcome out;
  out.message = absl::StrCat(
      "stage_weights: ", staged->bytes, " bytes staged from ", model_path,
      read->delta_parent.has_value()
          ? absl::StrCat(" (a delta of ", read->delta_bytes, " bytes applied to version ",
                         *read->delta_parent, ": ", read->phases, ")")
          : "",
      " as version ", staged->version.has_value() ? absl::StrCat(*staged->version) : "current + 1",
      staged->manifest_sha256.empty()
          ? ""
          : absl::StrCat(", verified against its manifest (sha256 ", staged->manifest_sha256, ")"),
      device_note.empty() ? "" : absl::StrCat("; ", device_note), " (ActivateWeights serves it)");
  out.weight_version = deps_.engine->weight_version();
  out.duration_us = MicrosSince(start);
  staged_ = std::move(staged);
  return out;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::ActivateStagedWeights(
    const UpdatePolicy& policy) {
  std::unique_ptr<StagedVersion> staged;
  {
    absl::MutexLock lock(&stage_mu_);
    if (staged_ == nullptr) {
      return absl::FailedPreconditionError(
          staging_ ? "activate_weights: the stage is still being read; activate once StageWeights "
                     "answered"
                   : "activate_weights: nothing is staged (StageWeights first)");
    }
    if (policy.weight_version.has_value() && staged_->version.has_value() &&
        *policy.weight_version != *staged_->version) {
      return absl::FailedPreconditionError(
          absl::StrCat("activate_weights: the staged version is ", *staged_->version, ", not ",
                       *policy.weight_version, " (nothing changed)"));
    }
    staged = std::move(staged_);
  }
  UpdatePolicy p = policy;
  if (staged->version.has_value()) p.weight_version = staged->version;
  bool applied = false;  // staged tensors: the copy into the served weights started
  bool swapped = false;  // staged weights: swapped in (`staged->weights` is the old version)
  uint64_t apply = 0;    // this apply's number (UpdateLifecycle::applies)
  // One engine-thread step (no pause step of its own: the data is here): pause (in place with
  // keep_kv, else retract), swap, flush or keep the KV, bump, resume.
  absl::StatusOr<AdminOutcome> out = lifecycle_.Run(
      "activate_weights", p,
      [&](model::ModelRunner& runner) -> absl::Status {
        apply = lifecycle_.applies();
        if (staged->weights == nullptr) {
          // A staged tensor stream or group receive: verified at staging, checked again against
          // the runner before the first byte is written (ApplyStaged), then copied in.
          applied = true;
          return Annotate(ApplyStaged(runner, staged->tensors), staged->source);
        }
        if (staged->built_on.has_value() && deps_.engine->weight_version() != *staged->built_on) {
          // Built on a version no longer served: activating it would drop the updates since.
          return absl::FailedPreconditionError(
              absl::StrCat("activate_weights: the staged version was built on a copy of version ",
                           *staged->built_on, ", but this worker now serves version ",
                           deps_.engine->weight_version(), " (drop it and stage again)"));
        }
        if (!staged->manifest_sha256.empty() && staged->version.has_value()) {
          // A version recorded since the stage (another publication) still wins.
          RETURN_IF_ERROR(ledger_.CheckSameContent(*staged->version, staged->manifest_sha256));
        }
        if (staged->from_tensors && lifecycle_.asleep()) {
          // Asleep: nothing to swap; the sleeping runner keeps the tensors for the wake.
          applied = true;
          RETURN_IF_ERROR(Annotate(CopyWeightsIn(runner, *staged->weights), staged->source));
          NoteServedDigest(staged->computed_sha256, std::move(staged->tensor_sha256));
          return absl::OkStatus();
        }
        RETURN_IF_ERROR(Annotate(
            runner.ActivateWeights(&staged->weights, staged->reload_path, staged->identity),
            staged->path));
        swapped = true;
        NoteServedDigest(
            staged->manifest_sha256.empty() ? staged->computed_sha256 : staged->manifest_sha256,
            std::move(staged->tensor_sha256));
        return absl::OkStatus();
      },
      {.self_pause = true});
  if (out.ok() && !staged->manifest_sha256.empty()) {
    ledger_.Record(out->weight_version, staged->manifest_sha256);
  }
  if (out.ok() && staged->weights == nullptr && !swapped) {
    // Staged tensors copied in: the served digest from the digests computed at staging.
    NoteTensorsApplied(apply, staged->tensor_sha256);
  }
  if (!out.ok() && !swapped && !applied &&
      (staged->weights != nullptr || !staged->tensors.empty())) {
    // Not swapped in: still staged (unless a new stage came meanwhile).
    absl::MutexLock lock(&stage_mu_);
    if (staged_ == nullptr && !staging_) {
      staged_ = std::move(staged);
      return WithNote(out.status(), "nothing changed; the version is still staged");
    }
  }
  reaper_.Free(std::move(staged));  // the replaced weights or the applied tensors
  return out;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::DropStagedWeights() {
  std::unique_ptr<StagedVersion> dropped;
  {
    absl::MutexLock lock(&stage_mu_);
    if (staging_) {
      return absl::FailedPreconditionError(
          "drop_staged_weights: a stage is being read; drop once StageWeights answered");
    }
    dropped = std::move(staged_);
  }
  AdminOutcome out;
  out.message = dropped == nullptr ? "drop_staged_weights: nothing was staged"
                                   : absl::StrCat("drop_staged_weights: dropped ", dropped->bytes,
                                                  " bytes staged from ", dropped->source);
  out.weight_version = deps_.engine->weight_version();
  return out;  // `dropped` is freed here, outside the lock
}

absl::StatusOr<std::unique_ptr<StageTicket>> WeightUpdateController::BeginStage(
    const std::string& source, std::optional<int64_t> weight_version) {
  if (weight_version.has_value() && *weight_version < 0) {
    return absl::InvalidArgumentError("weight_version: must be >= 0");
  }
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<StagedVersion> old;
  {
    absl::MutexLock lock(&stage_mu_);
    if (staging_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stage (", source,
          "): another stage is in progress (one staged version per worker); wait for its answer"));
    }
    staging_ = true;
    old = std::move(staged_);  // one staged version at most: the old one goes first
  }
  ReceiveStarts();
  reaper_.Free(std::move(old));
  reaper_.Drain();  // freed (outside the lock) before the stage receives anything
  return std::make_unique<StageTicket>(
      [this, source, weight_version, start](std::vector<NamedTensor> tensors,
                                            std::map<std::string, std::string> digests) {
        return CommitStage(source, weight_version, start, std::move(tensors), std::move(digests));
      },
      [this] {
        absl::MutexLock lock(&stage_mu_);
        staging_ = false;
      },
      [this, source, weight_version, start](DeltaUpdate update) {
        return CommitDeltaStage(source, weight_version, start, std::move(update));
      });
}

absl::Status WeightUpdateController::CheckDeltaParent(int64_t parent_version) const {
  const int64_t served = deps_.engine->weight_version();
  if (served == parent_version) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "parent_version: the delta applies to version ", parent_version,
      " but this worker serves version ", served,
      ", so it does not hold the parent (send the full version, or the deltas from version ",
      served, "); nothing was applied or staged"));
}

absl::StatusOr<ReadVersion> WeightUpdateController::BuildDelta(
    const std::string& what, const DeltaUpdate& update, std::optional<int64_t> weight_version) {
  const weight_sync::Manifest* m = update.manifest ? &*update.manifest : nullptr;
  if (m != nullptr && weight_version.has_value() && *weight_version != m->version) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight_version: ", *weight_version, ", but the manifest is of version ", m->version));
  }
  if (m != nullptr && update.parent_version.has_value() && m->parent_version.has_value() &&
      *m->parent_version != *update.parent_version) {
    return absl::InvalidArgumentError(absl::StrCat("parent_version: ", *update.parent_version,
                                                   ", but the manifest names parent version ",
                                                   *m->parent_version));
  }
  reaper_.Drain();  // what an earlier update replaced is gone before the copy allocates
  std::vector<weight_sync::DeltaTensor> views;
  views.reserve(update.deltas.size());
  for (const weight_sync::NamedDelta& d : update.deltas) {
    views.push_back({d.name, d.dtype, d.delta.view()});
  }
  auto build = [&] {
    return BuildOnServedCopy(what,
                             {.parent = update.parent_version,
                              .manifest = m,
                              .version = weight_version,
                              .deltas = views,
                              .dense = update.dense},
                             {.engine = deps_.engine,
                              .model_config = deps_.model_config,
                              .limits = deps_.limits,
                              .ledger = &ledger_});
  };
  // At the staging priority, like a disk stage's read: the copy's page faults, the apply and the
  // verification yield the core to the engine thread.
  if (deps_.staging_nice <= 0) return build();
  return RunAtLowPriority(deps_.staging_nice, build);
}

absl::StatusOr<AdminOutcome> WeightUpdateController::CommitDeltaStage(
    const std::string& source, std::optional<int64_t> weight_version,
    std::chrono::steady_clock::time_point start, DeltaUpdate update) {
  // Off the engine thread (the caller's): the copy hops onto it in slices, the rest runs here.
  absl::StatusOr<ReadVersion> read =
      BuildDelta(absl::StrCat("stage (", source, ")"), update, weight_version);
  absl::MutexLock lock(&stage_mu_);
  staging_ = false;
  if (!read.ok()) {
    lifecycle_.RecordError(std::string(read.status().message()));
    return WithNote(read.status(), "nothing is staged");
  }
  auto staged = std::make_unique<StagedVersion>();
  staged->version = read->version;
  staged->source = source;
  staged->manifest_sha256 = read->manifest_sha256;
  staged->tensor_sha256 = std::move(read->tensor_sha256);
  staged->delta_parent = read->delta_parent;
  staged->built_on = read->built_on;
  staged->bytes = read->weights->TotalBytes();
  staged->weights = std::move(read->weights);
  AdminOutcome out;
  out.message = absl::StrCat(
      "stage (", source, "): ", update.deltas.size(), " deltas and ", update.dense.size(),
      " whole tensors applied to ",
      read->delta_parent.has_value() ? absl::StrCat("version ", *read->delta_parent)
                                     : std::string("the served version"),
      " (", read->phases, "), ", staged->bytes, " bytes staged as version ",
      staged->version.has_value() ? absl::StrCat(*staged->version) : "current + 1",
      staged->manifest_sha256.empty()
          ? ""
          : absl::StrCat(", verified against its manifest (sha256 ", staged->manifest_sha256, ")"),
      " (ActivateWeights serves it)");
  out.weight_version = deps_.engine->weight_version();
  out.duration_us = MicrosSince(start);
  staged_ = std::move(staged);
  return out;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::UpdateWeightsFromDelta(
    DeltaUpdate update, const UpdatePolicy& policy) {
  if (policy.weight_version.has_value() && *policy.weight_version < 0) {
    return absl::InvalidArgumentError("weight_version: must be >= 0");
  }
  if (lifecycle_.asleep()) {
    return absl::FailedPreconditionError(
        "update (delta): the worker is asleep (a delta applies to the served weights; wake it "
        "first); nothing was applied");
  }
  // Stage + activate in one call: built and verified here, off the engine thread, while it keeps
  // generating; the engine pauses only for the swap and the flush. The staged slot is untouched.
  absl::StatusOr<ReadVersion> fresh = BuildDelta("update (delta)", update, policy.weight_version);
  if (!fresh.ok()) {
    lifecycle_.RecordError(std::string(fresh.status().message()));
    return WithNote(fresh.status(), "nothing was applied; the old weights keep serving");
  }
  UpdatePolicy p = policy;
  if (fresh->version.has_value()) p.weight_version = fresh->version;
  const int64_t built_on = fresh->built_on.value_or(-1);
  absl::StatusOr<AdminOutcome> out =
      lifecycle_.Run("update_weights_from_tensor", p,
                     [&](model::ModelRunner& runner) -> absl::Status {
                       // Another update since the copy: this one was built on weights no longer
                       // served.
                       const int64_t served = deps_.engine->weight_version();
                       if (served != built_on) {
                         return absl::FailedPreconditionError(absl::StrCat(
                             "update (delta): built on version ", built_on, " but version ", served,
                             " was activated meanwhile; nothing was applied"));
                       }
                       RETURN_IF_ERROR(runner.ActivateWeights(&fresh->weights, "", ""));
                       NoteServedDigest(fresh->manifest_sha256, std::move(fresh->tensor_sha256));
                       return absl::OkStatus();
                     },
                     {});
  reaper_.Free(std::move(fresh->weights));  // the weights served before, after the answer
  if (out.ok()) {
    if (!fresh->manifest_sha256.empty())
      ledger_.Record(out->weight_version, fresh->manifest_sha256);
    out->message = absl::StrCat(out->message, " (", update.deltas.size(), " deltas and ",
                                update.dense.size(), " whole tensors; ", fresh->phases, ")");
  }
  return out;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::ReceiveDeltaWeights(
    const std::string& group_name, WeightBuckets buckets, GroupDelta delta,
    const UpdatePolicy& policy, bool stage) {
  if (policy.weight_version.has_value() && *policy.weight_version < 0) {
    return absl::InvalidArgumentError("weight_version: must be >= 0");
  }
  RETURN_IF_ERROR(CheckGroupDelta(buckets, delta, deps_.limits));
  RETURN_IF_ERROR(CheckDeltaParent(delta.parent_version));
  ASSIGN_OR_RETURN(const UpdateGroups::Claim claim,
                   CheckAndClaim(group_name, buckets, ClaimFor::kReceive));
  std::unique_ptr<StageTicket> ticket;
  const std::string source = absl::StrCat("group:", group_name);
  if (stage) {
    ASSIGN_OR_RETURN(ticket, BeginStage(source, policy.weight_version));
  }
  // Off the engine thread (this admin-executor thread): the engine keeps generating meanwhile.
  std::vector<NamedTensor> received;
  if (absl::Status s = ReceiveBuckets(claim.receiver(), buckets, &received, nullptr, &delta);
      !s.ok()) {
    lifecycle_.RecordError(std::string(s.message()));
    return Annotate(s, stage ? "receive_weights (delta, stage): nothing is staged"
                             : "receive_weights (delta): nothing was applied");
  }
  DeltaUpdate update = GroupDeltaUpdate(std::move(received), std::move(delta));
  if (stage) return ticket->CommitDelta(std::move(update));
  return UpdateWeightsFromDelta(std::move(update), policy);
}

absl::StatusOr<AdminOutcome> WeightUpdateController::CompletePreparedDelta(
    const std::string& group_name, UpdateGroups::Claim& claim, const UpdatePolicy& policy,
    bool stage) {
  StagedReceive& prepared = *claim.prepared();
  const GroupDelta& delta = *prepared.delta();
  const std::string what =
      stage ? "complete_weights_update (delta, stage)" : "complete_weights_update (delta)";
  // Refusals before the received data is used keep the prepared receive for a retry.
  absl::Status early;
  if (policy.weight_version.has_value() && *policy.weight_version < 0) {
    early = absl::InvalidArgumentError("weight_version: must be >= 0");
  } else if (policy.weight_version.has_value() && delta.manifest.has_value() &&
             *policy.weight_version != delta.manifest->version) {
    early = absl::InvalidArgumentError(absl::StrCat("weight_version: ", *policy.weight_version,
                                                    ", but the prepared delta's manifest is of "
                                                    "version ",
                                                    delta.manifest->version));
  } else if (!stage && lifecycle_.asleep()) {
    early = absl::FailedPreconditionError(
        absl::StrCat(what,
                     ": the worker is asleep (a delta applies to the served weights; wake "
                     "it first)"));
  }
  std::unique_ptr<StageTicket> ticket;
  if (early.ok() && stage) {
    absl::StatusOr<std::unique_ptr<StageTicket>> begun =
        BeginStage(absl::StrCat("group:", group_name), policy.weight_version);
    if (begun.ok()) {
      ticket = *std::move(begun);
    } else {
      early = begun.status();
    }
  }
  if (!early.ok()) {
    const bool kept = groups_.GiveBack(group_name, claim);
    return WithNote(early, kept
                               ? "nothing is applied or staged and the prepared update is kept "
                                 "(call CompleteWeightsUpdate again)"
                               : "nothing is applied or staged; the group was destroyed meanwhile");
  }
  // The one delta path of every transport (publication.h, BuildOnServedCopy), as ReceiveWeights.
  DeltaUpdate update = prepared.TakeDeltaUpdate();
  absl::StatusOr<AdminOutcome> out = stage ? ticket->CommitDelta(std::move(update))
                                           : UpdateWeightsFromDelta(std::move(update), policy);
  if (!out.ok()) return WithNote(out.status(), "the prepared update is dropped (prepare again)");
  return out;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::CommitStage(
    const std::string& source, std::optional<int64_t> weight_version,
    std::chrono::steady_clock::time_point start, std::vector<NamedTensor> tensors,
    std::map<std::string, std::string> digests) {
  // Checked again here whatever the source did: only complete, served-shaped tensors are staged.
  absl::Status valid;
  if (tensors.empty()) {
    valid = absl::InvalidArgumentError("the stage carried no tensor");
  } else {
    std::vector<const model::TensorInfo*> infos;
    std::vector<int64_t> sizes;
    for (const NamedTensor& t : tensors) {
      infos.push_back(&t.info);
      sizes.push_back(static_cast<int64_t>(t.bytes.size()));
    }
    valid = ValidateTensors(served_, infos, sizes);
  }
  // Computed while staging (off the engine thread, at the staging priority), so the activation
  // knows the digest it serves without hashing in the pause; taken as given when the caller
  // computed them already (a verified full-state stream) and they name exactly these tensors.
  bool given = valid.ok() && digests.size() == tensors.size();
  for (const NamedTensor& t : tensors) given = given && digests.contains(t.info.name);
  if (valid.ok() && !given) digests = DigestTensors(tensors);
  // Every served weight whole in its held dtype: the tensors become a Weights (no copy), served
  // by a pointer swap at activation, and uploaded to a second device copy now on CUDA.
  int64_t bytes = 0;
  for (const NamedTensor& t : tensors) bytes += static_cast<int64_t>(t.bytes.size());
  const size_t count = tensors.size();
  std::unique_ptr<model::Weights> whole;
  std::string device_note;
  if (valid.ok()) whole = AsFullWeights(&tensors);
  if (whole != nullptr) device_note = StageOnDevice(*whole);
  absl::MutexLock lock(&stage_mu_);
  staging_ = false;
  if (!valid.ok()) {
    lifecycle_.RecordError(std::string(valid.message()));
    return Annotate(valid, absl::StrCat("stage (", source, "): nothing is staged"));
  }
  auto staged = std::make_unique<StagedVersion>();
  staged->version = weight_version;
  staged->source = source;
  staged->bytes = bytes;
  staged->tensors = std::move(tensors);  // empty when `whole` took them
  staged->weights = std::move(whole);
  staged->from_tensors = staged->weights != nullptr;
  if (CoversServed(digests)) staged->computed_sha256 = RankDigest(digests);
  staged->tensor_sha256 = std::move(digests);
  AdminOutcome out;
  out.message = absl::StrCat(
      "stage (", source, "): ", count, " tensors (", staged->bytes, " bytes) staged as version ",
      weight_version.has_value() ? absl::StrCat(*weight_version) : "current + 1",
      staged->from_tensors ? " (every served weight: activated by a swap, not a copy)"
                           : " (some weights: copied into the served ones at activation)",
      device_note.empty() ? "" : absl::StrCat("; ", device_note), " (ActivateWeights serves it)");
  out.weight_version = deps_.engine->weight_version();
  out.duration_us = MicrosSince(start);
  staged_ = std::move(staged);
  return out;
}

absl::Status WeightUpdateController::CopyWeightsIn(model::ModelRunner& runner,
                                                   const model::Weights& weights) {
  absl::Status copied;
  weights.Visit([&](const model::TensorInfo& info, absl::Span<const uint8_t> bytes) {
    if (copied.ok()) copied = runner.UpdateWeight(info, bytes);
  });
  return copied;
}

std::unique_ptr<model::Weights> WeightUpdateController::AsFullWeights(
    std::vector<NamedTensor>* tensors) const {
  if (tensors->size() != served_.size()) return nullptr;
  std::map<std::string, const model::TensorInfo*> held;
  for (const model::TensorInfo& t : served_) held[t.name] = &t;
  for (const NamedTensor& t : *tensors) {
    auto it = held.find(t.info.name);
    if (it == held.end() || it->second->dtype != t.info.dtype) return nullptr;  // converted later
  }
  // The tensors' buffers become the weights' (shared ownership; moving the vector keeps them).
  auto owner = std::make_shared<std::vector<NamedTensor>>(std::move(*tensors));
  std::vector<model::OwnedTensor> owned;
  owned.reserve(owner->size());
  for (NamedTensor& t : *owner) {
    owned.push_back({.info = t.info,
                     .data = t.bytes.data(),
                     .owner = owner,
                     .num_bytes = static_cast<int64_t>(t.bytes.size())});
  }
  absl::StatusOr<std::unique_ptr<model::Weights>> w =
      model::WeightsFromOwnedTensors(std::move(owned), deps_.model_config);
  if (!w.ok()) {
    // Validated against the served weights already; keep them as tensors (copied in later).
    spdlog::warn("stage: the staged tensors are kept as tensors: {}", w.status().ToString());
    *tensors = std::move(*owner);
    return nullptr;
  }
  return *std::move(w);
}

absl::StatusOr<AdminOutcome> WeightUpdateController::CompleteWeightsUpdateStaged(
    const std::string& group_name, std::optional<int64_t> weight_version) {
  ASSIGN_OR_RETURN(UpdateGroups::Claim claim, groups_.Take(group_name, ClaimFor::kComplete));
  StagedReceive& prepared = *claim.prepared();
  if (absl::Status received = prepared.Wait(); !received.ok()) {
    return PreparedReceiveFailed(received,
                                 "complete_weights_update (stage): the prepared receive failed "
                                 "(nothing is staged; prepare again)");
  }
  if (prepared.delta().has_value()) {
    UpdatePolicy policy;
    policy.weight_version = weight_version;
    return CompletePreparedDelta(group_name, claim, policy, true);
  }
  absl::StatusOr<std::unique_ptr<StageTicket>> ticket =
      BeginStage(absl::StrCat("group:", group_name), weight_version);
  if (!ticket.ok()) {
    const bool kept = groups_.GiveBack(group_name, claim);
    return WithNote(ticket.status(),
                    kept ? "nothing is staged and the prepared update is kept (call "
                           "CompleteWeightsUpdate again)"
                         : "nothing is staged; the group was destroyed meanwhile");
  }
  return (*ticket)->Commit(prepared.TakeTensors());
}

absl::StatusOr<AdminOutcome> WeightUpdateController::ReceiveWeightsStaged(
    const std::string& group_name, WeightBuckets buckets, std::optional<int64_t> weight_version) {
  ASSIGN_OR_RETURN(const UpdateGroups::Claim claim,
                   CheckAndClaim(group_name, buckets, ClaimFor::kReceive));
  ASSIGN_OR_RETURN(std::unique_ptr<StageTicket> ticket,
                   BeginStage(absl::StrCat("group:", group_name), weight_version));
  // Off the engine thread (this admin-executor thread): the engine keeps generating meanwhile.
  std::vector<NamedTensor> received;
  if (absl::Status s = ReceiveBuckets(claim.receiver(), buckets, &received); !s.ok()) {
    lifecycle_.RecordError(std::string(s.message()));
    return Annotate(s, "receive_weights (stage): nothing is staged");
  }
  return ticket->Commit(std::move(received));
}

absl::StatusOr<AdminOutcome> WeightUpdateController::UpdateWeightsFromTensors(
    std::vector<NamedTensor> tensors, const UpdatePolicy& policy) {
  if (tensors.empty()) return absl::InvalidArgumentError("chunk: the stream carried no tensor");
  // The served digest afterwards: the verified one of a full-state stream; else, for tensors
  // swapped in (they become the served weights, which a later update may write in place), computed
  // here before the pause; for tensors copied in, after the answer (DigestAfterAnswer).
  std::map<std::string, std::string> digests;
  const bool maybe_whole = tensors.size() == served_.size();
  if (policy.verified_sha256.empty() && maybe_whole) digests = DigestTensors(tensors);
  // Every served weight in its held dtype: swapped in (no copy in the pause), else copied in.
  std::unique_ptr<model::Weights> whole = AsFullWeights(&tensors);
  uint64_t apply = 0;
  absl::StatusOr<AdminOutcome> out =
      lifecycle_.Run("update_weights_from_tensor", policy,
                     [&](model::ModelRunner& runner) -> absl::Status {
                       apply = lifecycle_.applies();
                       if (whole == nullptr) {
                         RETURN_IF_ERROR(ApplyStaged(runner, tensors));
                       } else if (lifecycle_.asleep()) {
                         RETURN_IF_ERROR(CopyWeightsIn(runner, *whole));
                       } else {
                         RETURN_IF_ERROR(runner.ActivateWeights(&whole, "", ""));
                       }
                       if (!policy.verified_sha256.empty()) {
                         NoteServedDigest(policy.verified_sha256, policy.verified_tensor_sha256);
                       }
                       return absl::OkStatus();
                     },
                     {});
  reaper_.Free(std::move(whole));  // the weights served before (after a swap)
  if (out.ok() && policy.verified_sha256.empty()) {
    if (!digests.empty()) {
      NoteTensorsApplied(apply, digests);
      reaper_.Free(std::move(tensors));
    } else {
      DigestAfterAnswer(apply, std::move(tensors));  // copied in: hashed after the answer
    }
  } else {
    reaper_.Free(std::move(tensors));
  }
  return out;
}

void WeightUpdateController::NoteServedDigest(const std::string& sha256,
                                              std::map<std::string, std::string> tensors) {
  absl::MutexLock lock(&digest_mu_);
  digest_applies_ = lifecycle_.applies();  // this apply's (counted before it ran)
  digest_pending_ = false;
  digest_ = sha256;
  digest_tensors_ = sha256.empty() ? std::map<std::string, std::string>() : std::move(tensors);
}

void WeightUpdateController::NoteTensorsApplied(uint64_t apply,
                                                const std::map<std::string, std::string>& updated) {
  absl::MutexLock lock(&digest_mu_);
  if (digest_applies_ > apply) return;  // a later apply noted its own already
  const bool base_known =
      digest_applies_ + 1 == apply && !digest_pending_ && !digest_tensors_.empty();
  const bool everything = CoversServed(updated);
  digest_applies_ = apply;
  digest_pending_ = false;
  if (updated.empty() || (!base_known && !everything)) {
    digest_.clear();
    digest_tensors_.clear();
    return;
  }
  if (everything) {
    digest_tensors_ = updated;
  } else {
    for (const auto& [name, sha] : updated) digest_tensors_[name] = sha;
  }
  digest_ = RankDigest(digest_tensors_);
}

bool WeightUpdateController::CoversServed(const std::map<std::string, std::string>& digests) const {
  if (digests.size() != served_.size()) return false;
  for (const model::TensorInfo& t : served_) {
    if (!digests.contains(t.name)) return false;
  }
  return true;
}

void WeightUpdateController::DigestAfterAnswer(uint64_t apply, std::vector<NamedTensor> tensors) {
  {
    absl::MutexLock lock(&digest_mu_);
    if (digest_applies_ >= apply || lifecycle_.applies() != apply) {
      // Another apply started since: it says what is served (its digest, pending or unknown).
      reaper_.Free(std::move(tensors));
      return;
    }
    const bool base_known =
        digest_applies_ + 1 == apply && !digest_pending_ && !digest_tensors_.empty();
    digest_applies_ = apply;
    digest_.clear();
    digest_pending_ = false;
    if (!base_known) digest_tensors_.clear();
    // Possibly every served weight (checked once hashed), or some on known per-tensor digests.
    if (!base_known && tensors.size() < served_.size()) {
      reaper_.Free(std::move(tensors));
      return;
    }
    digest_pending_ = true;
  }
  hasher_.Post([this, apply, receives = receives_.load(), tensors = std::move(tensors)] {
    if (deps_.before_digest) deps_.before_digest();
    // Stops at the first tensor after another apply started (or the controller goes): that
    // apply replaced what this one served, so the digest would never be published. Stops too
    // when another receive starts (ReceiveStarts): the tensors held here are freed before that
    // receive's arrive, so a worker never holds two received copies; the digest is then unknown.
    auto dropped = [&] {
      return stopping_.load() || lifecycle_.applies() != apply || receives_.load() != receives;
    };
    std::map<std::string, std::string> digests;
    for (const NamedTensor& t : tensors) {
      if (dropped()) break;
      digests[t.info.name] = TensorDigest(t.info, t.bytes);
      hashed_bytes_.fetch_add(static_cast<int64_t>(t.bytes.size()));
    }
    absl::MutexLock lock(&digest_mu_);
    if (digest_applies_ != apply || !digest_pending_) return;  // a later apply noted its own
    digest_pending_ = false;
    const bool everything = CoversServed(digests);
    if (digests.size() != tensors.size() || dropped() || (!everything && digest_tensors_.empty())) {
      digest_tensors_.clear();  // unknown: dropped, or some tensors on unknown ones
      return;
    }
    if (everything) {
      digest_tensors_ = std::move(digests);
    } else {
      for (auto& [name, sha] : digests) digest_tensors_[name] = std::move(sha);
    }
    digest_ = RankDigest(digest_tensors_);
  });
}

std::map<std::string, std::string> WeightUpdateController::DigestTensors(
    const std::vector<NamedTensor>& tensors) {
  auto digest = [&] {
    std::map<std::string, std::string> out;
    for (const NamedTensor& t : tensors) {
      out[t.info.name] = TensorDigest(t.info, t.bytes);
      hashed_bytes_.fetch_add(static_cast<int64_t>(t.bytes.size()));
    }
    return out;
  };
  if (deps_.staging_nice <= 0) return digest();
  return RunAtLowPriority(deps_.staging_nice, digest);
}

std::string WeightUpdateController::served_sha256() const {
  absl::MutexLock lock(&digest_mu_);
  return digest_applies_ == lifecycle_.applies() && !digest_pending_ ? digest_ : "";
}

bool WeightUpdateController::served_digest_pending() const {
  absl::MutexLock lock(&digest_mu_);
  return digest_applies_ == lifecycle_.applies() && digest_pending_;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::InitWeightsUpdateGroup(const GroupRequest& r) {
  if (r.group_name.empty()) return absl::InvalidArgumentError("group_name: must not be empty");
  if (r.master_address.empty()) {
    return absl::InvalidArgumentError("master_address: must not be empty");
  }
  if (r.master_port <= 0 || r.master_port > 65535) {
    return absl::InvalidArgumentError("master_port: must be in [1, 65535]");
  }
  if (r.world_size < 2) {
    return absl::InvalidArgumentError("world_size: must be >= 2 (trainer + worker)");
  }
  if (r.rank_offset < 1 || r.rank_offset >= r.world_size) {
    return absl::InvalidArgumentError(
        "rank_offset: must be in [1, world_size) (rank 0 is the trainer)");
  }
  if (r.timeout_ms <= 0) return absl::InvalidArgumentError("timeout_ms: must be > 0");
  if (groups_.Contains(r.group_name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("group_name: '", r.group_name, "' already exists"));
  }
  const auto start = std::chrono::steady_clock::now();
  weight_sync::GroupOptions options;
  options.backend = r.backend.empty() ? "tcp" : r.backend;
  options.master_address = r.master_address;
  options.master_port = r.master_port;
  options.rank = r.rank_offset;
  options.world_size = r.world_size;
  options.group_name = r.group_name;
  options.timeout = std::chrono::milliseconds(r.timeout_ms);
  options.cuda_device = deps_.cuda_device;
  auto receiver = deps_.connect(options);
  if (!receiver.ok()) {
    lifecycle_.RecordError(std::string(receiver.status().message()));
    return receiver.status();
  }
  RETURN_IF_ERROR(groups_.Join(r.group_name, *std::move(receiver)));
  AdminOutcome out;
  out.message = absl::StrCat("joined group '", r.group_name, "' as rank ", r.rank_offset, " of ",
                             r.world_size, " (", options.backend, ")");
  out.weight_version = deps_.engine->weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::UpdateWeightsFromDistributed(
    const std::string& group_name, std::vector<model::TensorInfo> specs,
    const UpdatePolicy& policy) {
  ASSIGN_OR_RETURN(const UpdateGroups::Claim claim, groups_.Take(group_name, ClaimFor::kReceive));
  if (specs.empty()) return absl::InvalidArgumentError("names: no tensor in the bucket");
  return lifecycle_.Run(
      "update_weights_from_distributed", policy,
      [&](model::ModelRunner& runner) -> absl::Status {
        std::vector<const model::TensorInfo*> infos;
        for (const auto& s : specs) infos.push_back(&s);
        RETURN_IF_ERROR(
            ValidateTensors(runner.ListWeights(), infos, std::vector<int64_t>(specs.size(), -1)));
        std::vector<weight_sync::TensorSpec> wire;
        for (const auto& s : specs) wire.push_back({s.name, s.dtype, s.shape});
        std::map<std::string, const model::TensorInfo*> by_name;
        for (const auto& s : specs) by_name[s.name] = &s;
        return claim.receiver()->Receive(
            wire, [&](const weight_sync::TensorSpec& spec, absl::Span<const uint8_t> bytes) {
              return runner.UpdateWeight(*by_name.at(spec.name), bytes);
            });
      },
      {.failure_keeps_pause = true});
}

absl::StatusOr<AdminOutcome> WeightUpdateController::DestroyWeightsUpdateGroup(
    const std::string& group_name) {
  RETURN_IF_ERROR(groups_.Leave(group_name));
  AdminOutcome out;
  out.message = absl::StrCat("left group '", group_name, "'");
  out.weight_version = deps_.engine->weight_version();
  return out;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::PrepareWeightsUpdate(
    const std::string& group_name, WeightBuckets buckets) {
  return PostPrepared(group_name, std::move(buckets), std::nullopt);
}

absl::StatusOr<AdminOutcome> WeightUpdateController::PrepareDeltaWeightsUpdate(
    const std::string& group_name, WeightBuckets buckets, GroupDelta delta) {
  // The checks of the one-call delta receive, before anything is posted: no payload travels for
  // a worker that cannot use it.
  RETURN_IF_ERROR(CheckGroupDelta(buckets, delta, deps_.limits));
  RETURN_IF_ERROR(CheckDeltaParent(delta.parent_version));
  return PostPrepared(group_name, std::move(buckets), std::move(delta));
}

absl::StatusOr<AdminOutcome> WeightUpdateController::PostPrepared(const std::string& group_name,
                                                                  WeightBuckets buckets,
                                                                  std::optional<GroupDelta> delta) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const UpdateGroups::Claim claim,
                   CheckAndClaim(group_name, buckets, ClaimFor::kPrepare));
  int64_t num_tensors = 0;
  for (const auto& b : buckets) num_tensors += static_cast<int64_t>(b.size());
  const std::string kind =
      delta.has_value() ? absl::StrCat(" (a delta of version ", delta->parent_version, ")") : "";
  absl::StatusOr<std::unique_ptr<StagedReceive>> prepared =
      StagedReceive::Post(claim.shared_receiver(), std::move(buckets), std::move(delta));
  if (!prepared.ok()) {
    return Annotate(prepared.status(), "prepare_weights_update: the receive could not be posted");
  }
  if (!groups_.Park(group_name, claim, *prepared)) {
    // Destroyed (or shut down) meanwhile: its receiver is closed, so the receive ends now.
    prepared->reset();
    return absl::FailedPreconditionError(absl::StrCat("group '", group_name, "' was destroyed"));
  }
  AdminOutcome out;
  out.ready = true;
  out.message = absl::StrCat("prepare_weights_update: receive of ", num_tensors, " tensors", kind,
                             " posted on group '", group_name, "'");
  out.weight_version = deps_.engine->weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::CompleteWeightsUpdate(
    const std::string& group_name, const UpdatePolicy& policy) {
  ASSIGN_OR_RETURN(UpdateGroups::Claim claim, groups_.Take(group_name, ClaimFor::kComplete));
  StagedReceive& prepared = *claim.prepared();
  if (absl::Status received = prepared.Wait(); !received.ok()) {
    return PreparedReceiveFailed(received,
                                 "complete_weights_update: the prepared receive failed (nothing "
                                 "was applied; prepare again)");
  }
  if (prepared.delta().has_value()) return CompletePreparedDelta(group_name, claim, policy, false);
  bool applying = false;
  uint64_t apply = 0;
  absl::StatusOr<AdminOutcome> out =
      lifecycle_.Run("complete_weights_update", policy,
                     [&](model::ModelRunner& runner) {
                       applying = true;
                       apply = lifecycle_.applies();
                       return ApplyStaged(runner, prepared.tensors());
                     },
                     {.self_pause = true, .pause_step = true});
  if (out.ok()) {
    // The served digest: computed from the tensors just applied after this answer, on the
    // hashing thread, which holds (then frees) them; pending until then.
    DigestAfterAnswer(apply, prepared.TakeTensors());
    return out;
  }
  if (applying) {
    return WithNote(out.status(),
                    "the prepared update is dropped (its tensors were applied or "
                    "refused; prepare again)");
  }
  const bool kept = groups_.GiveBack(group_name, claim);
  return WithNote(out.status(), kept ? "nothing was applied and the prepared update is kept (call "
                                       "CompleteWeightsUpdate again)"
                                     : "nothing was applied; the group was destroyed meanwhile");
}

absl::StatusOr<AdminOutcome> WeightUpdateController::ReceiveWeights(const std::string& group_name,
                                                                    WeightBuckets buckets,
                                                                    const UpdatePolicy& policy) {
  ASSIGN_OR_RETURN(const UpdateGroups::Claim claim,
                   CheckAndClaim(group_name, buckets, ClaimFor::kReceive));
  std::vector<NamedTensor> staged;
  uint64_t apply = 0;
  absl::StatusOr<AdminOutcome> out =
      lifecycle_.Run("receive_weights", policy,
                     [&](model::ModelRunner& runner) {
                       apply = lifecycle_.applies();
                       RETURN_IF_ERROR(ReceiveBuckets(claim.receiver(), buckets, &staged));
                       return ApplyStaged(runner, staged);
                     },
                     {.self_pause = true, .pause_step = true});
  if (out.ok()) {
    // The served digest: computed after this answer (see CompleteWeightsUpdate).
    DigestAfterAnswer(apply, std::move(staged));
  } else {
    reaper_.Free(std::move(staged));
  }
  return out;
}

absl::StatusOr<std::vector<model::TensorInfo>> WeightUpdateController::ListWeights() {
  std::vector<model::TensorInfo> out;
  RETURN_IF_ERROR(deps_.engine->RunOnEngineThread([&](engine::EngineContext& ctx) {
    if (lifecycle_.asleep()) {
      return absl::FailedPreconditionError("list_weights: the worker is asleep");
    }
    out = ctx.runner().ListWeights();
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace rl::worker
