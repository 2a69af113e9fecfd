#include "services/worker/admin_convert.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/request_limits.h"
#include "common/weight_sync/delta.h"
#include "common/weight_sync/manifest.h"

namespace rl::worker {

void ToProto(const AdminOutcome& o, rl::v1::AdminResponse* out) {
  out->set_success(true);
  out->set_message(o.message);
  out->set_num_aborted(o.num_aborted);
  out->set_weight_version(o.weight_version);
  out->set_duration_us(o.duration_us);
  out->set_ready(o.ready);
  out->set_drained(o.drained);
  out->set_num_still_active(o.num_still_active);
  for (const std::string& id : o.still_active_ids) out->add_still_active_ids(id);
  out->set_num_held(o.num_held);
}

absl::Status FillFrom(const absl::StatusOr<AdminOutcome>& outcome, rl::v1::AdminResponse* out) {
  if (!outcome.ok()) return outcome.status();
  ToProto(*outcome, out);
  return absl::OkStatus();
}

absl::StatusOr<absl::Duration> DrainTimeoutFrom(const rl::v1::PauseGenerationRequest& req) {
  if (!req.has_drain_timeout_ms()) return absl::Milliseconds(kDefaultDrainTimeoutMs);
  if (req.drain_timeout_ms() < 0 || req.drain_timeout_ms() > kMaxDrainTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat("drain_timeout_ms: must be in [0, ",
                                                   kMaxDrainTimeoutMs, "], got ",
                                                   req.drain_timeout_ms()));
  }
  return absl::Milliseconds(req.drain_timeout_ms());
}

GroupRequest GroupRequestFrom(const rl::v1::InitWeightsUpdateGroupRequest& req,
                              const std::string& default_backend) {
  GroupRequest g;
  g.master_address = req.master_address();
  g.master_port = req.master_port();
  g.rank_offset = req.rank_offset();
  g.world_size = req.world_size();
  g.group_name = req.group_name();
  switch (req.backend()) {
    case rl::v1::GROUP_BACKEND_NCCL:
      g.backend = "nccl";
      break;
    case rl::v1::GROUP_BACKEND_TCP:
      g.backend = "tcp";
      break;
    default:
      g.backend = default_backend;
  }
  if (req.has_timeout_ms()) g.timeout_ms = req.timeout_ms();
  return g;
}

absl::StatusOr<std::vector<model::TensorInfo>> SpecsFrom(
    const rl::v1::UpdateWeightsFromDistributedRequest& req) {
  if (req.names_size() != req.dtypes_size() || req.names_size() != req.shapes_size()) {
    return absl::InvalidArgumentError(absl::StrCat("names/dtypes/shapes: lengths differ (",
                                                   req.names_size(), "/", req.dtypes_size(), "/",
                                                   req.shapes_size(), ")"));
  }
  std::vector<model::TensorInfo> specs;
  for (int i = 0; i < req.names_size(); ++i) {
    specs.push_back(
        {req.names(i), req.dtypes(i), {req.shapes(i).dims().begin(), req.shapes(i).dims().end()}});
  }
  return specs;
}

absl::StatusOr<WeightBuckets> BucketsFrom(
    const google::protobuf::RepeatedPtrField<rl::v1::WeightBucket>& in) {
  WeightBuckets out;
  for (int b = 0; b < in.size(); ++b) {
    const rl::v1::WeightBucket& bucket = in[b];
    if (bucket.names_size() != bucket.dtypes_size() ||
        bucket.names_size() != bucket.shapes_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buckets[", b, "]: names/dtypes/shapes lengths differ (", bucket.names_size(), "/",
          bucket.dtypes_size(), "/", bucket.shapes_size(), ")"));
    }
    std::vector<model::TensorInfo>& specs = out.emplace_back();
    for (int i = 0; i < bucket.names_size(); ++i) {
      specs.push_back({bucket.names(i),
                       bucket.dtypes(i),
                       {bucket.shapes(i).dims().begin(), bucket.shapes(i).dims().end()}});
    }
  }
  return out;
}

absl::StatusOr<GroupDelta> GroupDeltaFrom(
    const google::protobuf::RepeatedPtrField<rl::v1::WeightBucket>& in, int64_t parent_version,
    const std::string& manifest_json) {
  if (parent_version < 0) return absl::InvalidArgumentError("parent_version: must be >= 0");
  GroupDelta out;
  out.parent_version = parent_version;
  if (!manifest_json.empty()) {
    absl::StatusOr<weight_sync::Manifest> m =
        weight_sync::ParseManifest(manifest_json, "manifest_json");
    if (!m.ok()) return m.status();
    out.manifest = *std::move(m);
  }
  for (int b = 0; b < in.size(); ++b) {
    const rl::v1::WeightBucket& bucket = in[b];
    if (bucket.encodings_size() == 0 && bucket.delta_counts_size() == 0 &&
        bucket.payload_bytes_size() == 0) {
      continue;  // every tensor of the bucket whole
    }
    if (bucket.encodings_size() != bucket.names_size() ||
        bucket.delta_counts_size() != bucket.names_size() ||
        bucket.payload_bytes_size() != bucket.names_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buckets[", b, "]: encodings/delta_counts/payload_bytes must list one entry per name (",
          bucket.encodings_size(), "/", bucket.delta_counts_size(), "/",
          bucket.payload_bytes_size(), " for ", bucket.names_size(), " names)"));
    }
    for (int i = 0; i < bucket.names_size(); ++i) {
      const std::string& encoding = bucket.encodings(i);
      if (encoding.empty() || encoding == "dense") continue;
      const std::optional<weight_sync::DeltaEncoding> e = weight_sync::ParseDeltaEncoding(encoding);
      if (!e.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("buckets[", b, "].encodings[", i, "]: ", QuoteForError(encoding),
                         " (\"\", \"dense\", \"overwrite\" or \"xor\")"));
      }
      if (!out.encoded
               .emplace(bucket.names(i),
                        EncodedTensor{*e, bucket.delta_counts(i), bucket.payload_bytes(i)})
               .second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "buckets[", b, "].names[", i, "]: ", QuoteForError(bucket.names(i)), " listed twice"));
      }
    }
  }
  return out;
}

absl::StatusOr<CheckerAction> FromProto(rl::v1::WeightsCheckerAction action) {
  switch (action) {
    case rl::v1::WEIGHTS_CHECKER_ACTION_SNAPSHOT:
      return CheckerAction::kSnapshot;
    case rl::v1::WEIGHTS_CHECKER_ACTION_RESET_TENSORS:
      return CheckerAction::kResetTensors;
    case rl::v1::WEIGHTS_CHECKER_ACTION_COMPARE:
      return CheckerAction::kCompare;
    case rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM:
      return CheckerAction::kChecksum;
    default:
      return absl::InvalidArgumentError(
          "action: must be SNAPSHOT, RESET_TENSORS, COMPARE or CHECKSUM");
  }
}

void ToProto(const CheckerResult& r, rl::v1::WeightsCheckerResponse* out) {
  out->set_success(r.missing.empty() && r.unexpected.empty());
  out->set_message(r.message);
  for (const auto& s : r.missing) out->add_missing(s);
  for (const auto& s : r.unexpected) out->add_unexpected(s);
  for (const auto& s : r.changed) out->add_changed(s);
  for (const auto& [name, digest] : r.tensor_sha256) (*out->mutable_tensor_sha256())[name] = digest;
  out->set_rank_sha256(r.rank_sha256);
}

void ToProto(const std::vector<model::TensorInfo>& weights, rl::v1::ListWeightsResponse* out) {
  for (const auto& w : weights) {
    rl::v1::WeightInfo* info = out->add_weights();
    info->set_name(w.name);
    info->set_dtype(w.dtype);
    info->mutable_shape()->Assign(w.shape.begin(), w.shape.end());
  }
}

absl::Status CheckStagePolicy(const UpdatePolicy& policy) {
  if (policy.abort_all_requests || policy.keep_pause || policy.keep_kv) {
    return absl::InvalidArgumentError(
        "stage: abort_all_requests, keep_pause and keep_kv belong to ActivateWeights, not to a "
        "stage");
  }
  return absl::OkStatus();
}

}  // namespace rl::worker
