#include "services/worker/weight_update_controller.h"

#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_io/dtype.h"
#include "common/status.h"
#include "services/worker/weight_sync/weight_sync.h"
#include "services/worker/weight_update_check.h"
#include "spdlog/spdlog.h"

namespace rl::worker {
namespace {

int64_t MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

// Checks that every tensor names a held weight with the same shape, a float dtype and the
// right byte count (-1: not checked), and that no name repeats.
absl::Status ValidateTensors(const std::vector<model::TensorInfo>& held,
                             const std::vector<const model::TensorInfo*>& incoming,
                             const std::vector<int64_t>& byte_counts) {
  std::map<std::string, const model::TensorInfo*> by_name;
  for (const auto& t : held) by_name[t.name] = &t;
  std::set<std::string> seen;
  for (size_t i = 0; i < incoming.size(); ++i) {
    const model::TensorInfo& t = *incoming[i];
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': no such weight"));
    }
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': sent twice"));
    }
    if (t.shape != it->second->shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': shape [", absl::StrJoin(t.shape, ", "),
                       "] but the model has [", absl::StrJoin(it->second->shape, ", "), "]"));
    }
    const std::optional<model_io::DType> dtype = model_io::ParseDType(t.dtype);
    if (!dtype || !model_io::IsFloatWeightDType(*dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': dtype '", t.dtype, "' (F32, BF16 or F16)"));
    }
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (byte_counts[i] >= 0 && byte_counts[i] != numel * model_io::DTypeSize(*dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", byte_counts[i],
                                                     " bytes, expected ",
                                                     numel * model_io::DTypeSize(*dtype)));
    }
  }
  return absl::OkStatus();
}

// Validates and applies staged tensors (ValidateTensors first, so nothing changes on error).
absl::Status ApplyStaged(model::ModelRunner& runner, const std::vector<NamedTensor>& tensors) {
  std::vector<const model::TensorInfo*> infos;
  std::vector<int64_t> sizes;
  for (const NamedTensor& t : tensors) {
    infos.push_back(&t.info);
    sizes.push_back(static_cast<int64_t>(t.bytes.size()));
  }
  RETURN_IF_ERROR(ValidateTensors(runner.ListWeights(), infos, sizes));
  for (const NamedTensor& t : tensors) RETURN_IF_ERROR(runner.UpdateWeight(t.info, t.bytes));
  return absl::OkStatus();
}

// Receives `buckets` in order, copying every tensor into host staging. `on_posted` (may be
// empty) runs once the first bucket's receive is posted.
absl::Status ReceiveBuckets(weight_sync::WeightReceiver* receiver,
                            const std::vector<std::vector<model::TensorInfo>>& buckets,
                            std::vector<NamedTensor>* out,
                            const std::function<void()>& on_posted = nullptr) {
  for (size_t b = 0; b < buckets.size(); ++b) {
    const std::vector<model::TensorInfo>& bucket = buckets[b];
    std::vector<weight_sync::TensorSpec> wire;
    for (const auto& s : bucket) wire.push_back({s.name, s.dtype, s.shape});
    size_t next = 0;
    RETURN_IF_ERROR(receiver->Receive(
        wire,
        [&](const weight_sync::TensorSpec&, absl::Span<const uint8_t> bytes) {
          out->push_back({bucket[next++], std::vector<uint8_t>(bytes.begin(), bytes.end())});
          return absl::OkStatus();
        },
        b == 0 ? on_posted : nullptr));
  }
  return absl::OkStatus();
}

// `status` with `note` appended to its message, same code.
absl::Status WithNote(const absl::Status& status, absl::string_view note) {
  return absl::Status(status.code(), absl::StrCat(status.message(), "; ", note));
}

}  // namespace

// A group claimed by one call: clears the group's busy flag when it goes. For a Complete it
// also holds the prepared receive, taken out of the group.
class WeightUpdateController::Claim {
 public:
  Claim(WeightUpdateController* owner, std::shared_ptr<Group> group,
        std::shared_ptr<weight_sync::WeightReceiver> receiver,
        std::unique_ptr<PendingReceive> pending)
      : owner_(owner),
        group_(std::move(group)),
        receiver_(std::move(receiver)),
        pending_(std::move(pending)) {}
  Claim(Claim&& other) noexcept = default;
  Claim& operator=(Claim&&) = delete;
  ~Claim() {
    if (group_ == nullptr) return;  // moved from
    absl::MutexLock lock(&owner_->mu_);
    group_->busy = false;
  }

  const std::shared_ptr<Group>& group() const { return group_; }
  weight_sync::WeightReceiver* receiver() const { return receiver_.get(); }
  const std::shared_ptr<weight_sync::WeightReceiver>& shared_receiver() const { return receiver_; }
  PendingReceive* pending() const { return pending_.get(); }
  std::unique_ptr<PendingReceive> TakePending() { return std::move(pending_); }

 private:
  WeightUpdateController* owner_;
  std::shared_ptr<Group> group_;
  std::shared_ptr<weight_sync::WeightReceiver> receiver_;
  std::unique_ptr<PendingReceive> pending_;
};

WeightUpdateController::WeightUpdateController(Deps deps) : deps_(std::move(deps)) {
  if (!deps_.asleep) deps_.asleep = [] { return false; };
  if (!deps_.connect) deps_.connect = weight_sync::ConnectReceiver;
}

absl::StatusOr<std::unique_ptr<WeightUpdateController>> WeightUpdateController::Create(Deps deps) {
  std::unique_ptr<WeightUpdateController> c(new WeightUpdateController(std::move(deps)));
  ASSIGN_OR_RETURN(c->served_, c->ListWeights());
  return c;
}

WeightUpdateController::~WeightUpdateController() { Shutdown(); }

void WeightUpdateController::Shutdown() {
  std::vector<std::shared_ptr<Group>> groups;
  std::vector<std::unique_ptr<PendingReceive>> pending;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, group] : groups_) {
      groups.push_back(group);
      if (group->pending) pending.push_back(std::move(group->pending));
    }
    groups_.clear();
  }
  for (const auto& group : groups) group->receiver->Close();  // posted receives fail now
  for (const auto& p : pending) {
    if (p->thread.joinable()) p->thread.join();
  }
}

WeightUpdateStatus WeightUpdateController::status() const {
  WeightUpdateStatus out;
  absl::MutexLock lock(&mu_);
  out.update_failed = update_failed_;
  out.last_error = last_error_;
  for (const auto& [name, group] : groups_) out.groups.push_back(name);
  return out;
}

bool WeightUpdateController::Joined(const std::string& name,
                                    const std::shared_ptr<Group>& group) const {
  auto it = groups_.find(name);
  return it != groups_.end() && it->second == group;
}

void WeightUpdateController::NotifyUpdating() {
  if (deps_.updating_changed) deps_.updating_changed();
}

absl::StatusOr<AdminOutcome> WeightUpdateController::RunWeightUpdate(
    const char* what, const UpdatePolicy& policy,
    const std::function<absl::Status(model::ModelRunner&)>& apply, RunOptions options) {
  if (policy.weight_version.has_value() && *policy.weight_version < 0) {
    return absl::InvalidArgumentError("weight_version: must be >= 0");
  }
  const auto start = std::chrono::steady_clock::now();
  updates_in_progress_.fetch_add(1);
  NotifyUpdating();
  AdminOutcome out;
  engine::Engine& engine = *deps_.engine;
  // Whether a failure resumes the engine: it was running before this update paused it.
  bool resume_on_failure = false;
  // A self-pausing update pauses in a step of its own, so the pause is published (GetServerInfo
  // shows it) while `apply` holds the engine thread, e.g. receiving. The decision and the pause
  // are one engine-thread step: nothing starts or pauses between them.
  absl::Status status = absl::OkStatus();
  if (options.self_pause) {
    status = engine.RunOnEngineThread([&](engine::EngineContext& ctx) {
      resume_on_failure = !ctx.paused();
      if (!(ctx.paused() && ctx.pause_mode() >= engine::PauseMode::kRetract)) {
        ctx.Pause(engine::PauseMode::kRetract);
      }
      return absl::OkStatus();
    });
  }
  if (status.ok())
    status = engine.RunOnEngineThread([&](engine::EngineContext& ctx) -> absl::Status {
      const bool active = ctx.has_running() || ctx.has_waiting();
      const bool retracted = ctx.paused() && ctx.pause_mode() >= engine::PauseMode::kRetract;
      // Decided here, on the engine thread: nothing can start or pause between the check and
      // the pause below. A self-pausing update retracts whatever a Continue let run meanwhile.
      if (active && !policy.abort_all_requests && !retracted && !options.self_pause) {
        const engine::ServerInfo info = ctx.info();
        return absl::FailedPreconditionError(
            absl::StrCat(what, ": ", info.num_running, " running and ", info.num_waiting,
                         " waiting requests; pass abort_all_requests or pause with retract first"));
      }
      if (!options.self_pause) resume_on_failure = !ctx.paused();
      if (!retracted) ctx.Pause(engine::PauseMode::kRetract);
      if (policy.abort_all_requests)
        out.num_aborted = ctx.AbortAll(absl::StrCat(what, " aborted it"));
      if (absl::Status s = apply(ctx.runner()); !s.ok()) {
        if (!options.failure_keeps_pause && resume_on_failure && !deps_.asleep()) ctx.Continue();
        return s;
      }
      RETURN_IF_ERROR(ctx.FlushCache());
      const int64_t version = policy.weight_version.value_or(ctx.weight_version() + 1);
      ctx.set_weight_version(version);
      // Asleep: the runner staged the weights (sleepable_runner.h); they serve on wake, which
      // resumes the engine.
      if (!policy.keep_pause && !deps_.asleep()) ctx.Continue();
      out.weight_version = version;
      return absl::OkStatus();
    });
  updates_in_progress_.fetch_sub(1);
  NotifyUpdating();
  out.duration_us = MicrosSince(start);
  if (deps_.metrics != nullptr) deps_.metrics->RecordUpdate(out.duration_us / 1e6);
  {
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      update_failed_ = false;
      last_error_.clear();
    } else if (options.failure_keeps_pause &&
               status.code() != absl::StatusCode::kFailedPrecondition) {
      update_failed_ = true;
      last_error_ = std::string(status.message());
    }
  }
  if (!status.ok()) {
    spdlog::warn("{} failed: {}", what, std::string(status.message()));
    return status;
  }
  out.message = absl::StrCat(what, ": weight_version ", out.weight_version,
                             policy.keep_pause ? " (kept paused)" : "");
  spdlog::info("{} in {} ms", out.message, out.duration_us / 1000.0);
  return out;
}

absl::StatusOr<WeightUpdateController::Claim> WeightUpdateController::ClaimGroup(
    const std::string& group_name, ClaimFor what) {
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(group_name);
  if (what == ClaimFor::kComplete &&
      (it == groups_.end() || (!it->second->busy && it->second->pending == nullptr))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group '", group_name, "' has no prepared update (PrepareWeightsUpdate first)"));
  }
  if (it == groups_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("group_name: no group '", group_name, "' (InitWeightsUpdateGroup first)"));
  }
  Group& group = *it->second;
  if (group.busy) {
    return absl::FailedPreconditionError(
        absl::StrCat("group '", group_name,
                     "' is busy: another call is receiving or applying weights on it (one "
                     "receive per group at a time)"));
  }
  if (what != ClaimFor::kComplete && group.pending != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("group '", group_name, "' ", what == ClaimFor::kPrepare ? "already " : "",
                     "has a prepared update (CompleteWeightsUpdate first)"));
  }
  group.busy = true;
  return Claim(this, it->second, group.receiver,
               what == ClaimFor::kComplete ? std::move(group.pending) : nullptr);
}

absl::StatusOr<WeightUpdateController::Claim> WeightUpdateController::CheckAndClaim(
    const std::string& group_name, const std::vector<std::vector<model::TensorInfo>>& buckets,
    ClaimFor what) {
  if (buckets.empty()) return absl::InvalidArgumentError("buckets: no bucket listed");
  std::vector<const model::TensorInfo*> infos;
  for (const auto& bucket : buckets) {
    if (bucket.empty()) return absl::InvalidArgumentError("buckets: an empty bucket");
    for (const auto& s : bucket) infos.push_back(&s);
  }
  RETURN_IF_ERROR(ValidateTensors(served_, infos, std::vector<int64_t>(infos.size(), -1)));
  return ClaimGroup(group_name, what);
}

absl::StatusOr<AdminOutcome> WeightUpdateController::UpdateWeightsFromDisk(
    const std::string& model_path, const UpdatePolicy& policy) {
  RETURN_IF_ERROR(CheckDiskUpdate(model_path, deps_.model_config, deps_.limits));
  return RunWeightUpdate("update_weights_from_disk", policy,
                         [&](model::ModelRunner& runner) {
                           return Annotate(runner.LoadWeightsFromDisk(model_path), model_path);
                         },
                         {});
}

absl::StatusOr<AdminOutcome> WeightUpdateController::UpdateWeightsFromTensors(
    std::vector<NamedTensor> tensors, const UpdatePolicy& policy) {
  if (tensors.empty()) return absl::InvalidArgumentError("chunk: the stream carried no tensor");
  return RunWeightUpdate("update_weights_from_tensor", policy,
                         [&](model::ModelRunner& runner) { return ApplyStaged(runner, tensors); },
                         {});
}

absl::StatusOr<AdminOutcome> WeightUpdateController::InitWeightsUpdateGroup(const GroupRequest& r) {
  if (r.group_name.empty()) return absl::InvalidArgumentError("group_name: must not be empty");
  if (r.master_address.empty())
    return absl::InvalidArgumentError("master_address: must not be empty");
  if (r.master_port <= 0 || r.master_port > 65535) {
    return absl::InvalidArgumentError("master_port: must be in [1, 65535]");
  }
  if (r.world_size < 2)
    return absl::InvalidArgumentError("world_size: must be >= 2 (trainer + worker)");
  if (r.rank_offset < 1 || r.rank_offset >= r.world_size) {
    return absl::InvalidArgumentError(
        "rank_offset: must be in [1, world_size) (rank 0 is the trainer)");
  }
  if (r.timeout_ms <= 0) return absl::InvalidArgumentError("timeout_ms: must be > 0");
  {
    absl::MutexLock lock(&mu_);
    if (groups_.contains(r.group_name)) {
      return absl::AlreadyExistsError(
          absl::StrCat("group_name: '", r.group_name, "' already exists"));
    }
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
    absl::MutexLock lock(&mu_);
    last_error_ = std::string(receiver.status().message());
    return receiver.status();
  }
  auto group = std::make_shared<Group>();
  group->receiver = *std::move(receiver);
  bool joined = false;
  {
    absl::MutexLock lock(&mu_);
    joined = groups_.emplace(r.group_name, group).second;
  }
  if (!joined) {  // a concurrent InitWeightsUpdateGroup of the same name won
    group->receiver->Close();
    return absl::AlreadyExistsError(
        absl::StrCat("group_name: '", r.group_name, "' already exists"));
  }
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
  ASSIGN_OR_RETURN(const Claim claim, ClaimGroup(group_name, ClaimFor::kReceive));
  if (specs.empty()) return absl::InvalidArgumentError("names: no tensor in the bucket");
  return RunWeightUpdate(
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
  std::shared_ptr<Group> group;
  std::unique_ptr<PendingReceive> pending;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(group_name);
    if (it == groups_.end()) {
      return absl::NotFoundError(absl::StrCat("group_name: no group '", group_name, "'"));
    }
    group = std::move(it->second);
    groups_.erase(it);
    pending = std::move(group->pending);
  }
  group->receiver->Close();  // a receive in flight fails promptly
  if (pending && pending->thread.joinable()) pending->thread.join();
  AdminOutcome out;
  out.message = absl::StrCat("left group '", group_name, "'");
  out.weight_version = deps_.engine->weight_version();
  return out;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::PrepareWeightsUpdate(
    const std::string& group_name, std::vector<std::vector<model::TensorInfo>> buckets) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const Claim claim, CheckAndClaim(group_name, buckets, ClaimFor::kPrepare));
  int64_t num_tensors = 0;
  for (const auto& b : buckets) num_tensors += static_cast<int64_t>(b.size());
  auto p = std::make_unique<PendingReceive>();
  PendingReceive* raw = p.get();
  // Ready once the first bucket's receive is posted (the transport waits for its header: tcp
  // buffers what the trainer sends, nccl joins the broadcast after the header), or the
  // receive's error when it ended before (a closed or broken group).
  raw->thread =
      std::thread([raw, receiver = claim.shared_receiver(), buckets = std::move(buckets)] {
        raw->status = ReceiveBuckets(receiver.get(), buckets, &raw->tensors, [raw] {
          raw->posted = true;
          raw->settled.Notify();
        });
        if (!raw->posted) raw->settled.Notify();
      });
  raw->settled.WaitForNotification();
  if (!raw->posted) {
    raw->thread.join();
    return Annotate(raw->status, "prepare_weights_update: the receive could not be posted");
  }
  {
    absl::MutexLock lock(&mu_);
    if (Joined(group_name, claim.group())) claim.group()->pending = std::move(p);
  }
  if (p != nullptr) {  // destroyed (or shut down) meanwhile: its receiver is closed
    p->thread.join();
    return absl::FailedPreconditionError(absl::StrCat("group '", group_name, "' was destroyed"));
  }
  AdminOutcome out;
  out.ready = true;
  out.message = absl::StrCat("prepare_weights_update: receive of ", num_tensors,
                             " tensors posted on group '", group_name, "'");
  out.weight_version = deps_.engine->weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<AdminOutcome> WeightUpdateController::CompleteWeightsUpdate(
    const std::string& group_name, const UpdatePolicy& policy) {
  ASSIGN_OR_RETURN(Claim claim, ClaimGroup(group_name, ClaimFor::kComplete));
  PendingReceive& p = *claim.pending();
  if (p.thread.joinable()) p.thread.join();  // bounded by the group's stall timeout
  if (!p.status.ok()) {
    return Annotate(p.status,
                    "complete_weights_update: the prepared receive failed (nothing "
                    "was applied; prepare again)");
  }
  bool applying = false;
  absl::StatusOr<AdminOutcome> out = RunWeightUpdate("complete_weights_update", policy,
                                                     [&](model::ModelRunner& runner) {
                                                       applying = true;
                                                       return ApplyStaged(runner, p.tensors);
                                                     },
                                                     {.self_pause = true});
  if (out.ok()) return out;
  if (applying) {
    return WithNote(out.status(),
                    "the prepared update is dropped (its tensors were applied or "
                    "refused; prepare again)");
  }
  bool kept = false;
  {
    absl::MutexLock lock(&mu_);
    if (Joined(group_name, claim.group())) {
      claim.group()->pending = claim.TakePending();
      kept = true;
    }
  }
  return WithNote(out.status(), kept ? "nothing was applied and the prepared update is kept (call "
                                       "CompleteWeightsUpdate again)"
                                     : "nothing was applied; the group was destroyed meanwhile");
}

absl::StatusOr<AdminOutcome> WeightUpdateController::ReceiveWeights(
    const std::string& group_name, std::vector<std::vector<model::TensorInfo>> buckets,
    const UpdatePolicy& policy) {
  ASSIGN_OR_RETURN(const Claim claim, CheckAndClaim(group_name, buckets, ClaimFor::kReceive));
  return RunWeightUpdate("receive_weights", policy,
                         [&](model::ModelRunner& runner) {
                           std::vector<NamedTensor> staged;
                           RETURN_IF_ERROR(ReceiveBuckets(claim.receiver(), buckets, &staged));
                           return ApplyStaged(runner, staged);
                         },
                         {.self_pause = true});
}

absl::StatusOr<std::vector<model::TensorInfo>> WeightUpdateController::ListWeights() {
  std::vector<model::TensorInfo> out;
  RETURN_IF_ERROR(deps_.engine->RunOnEngineThread([&](engine::EngineContext& ctx) {
    if (deps_.asleep()) return absl::FailedPreconditionError("list_weights: the worker is asleep");
    out = ctx.runner().ListWeights();
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace rl::worker
