// rlctl's distributed-update commands: the trainer (rank 0, e.g. rl-weight-sender) broadcasts
// the tensor bytes over the group; rlctl sends the metadata (bucket JSON lines, bucket_plan.h).
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model_io/file_read.h"
#include "common/status.h"
#include "common/weight_sync/bucket_plan.h"
#include "tools/rlctl/commands.h"

namespace rl::rlctl {
namespace {

// A delta's manifest file is at most this big (the worker bounds it the same way).
constexpr int64_t kMaxManifestFileBytes = int64_t{64} << 20;

// Every bucket line on stdin (as `rl-weight-sender --plan-only` or `--delta` prints them) into
// the request's buckets; a delta's (encodings in the lines, --parent-version or the lines'
// parent_version) also sets parent_version and, with --manifest, manifest_json.
template <typename Request>
absl::Status ReadBuckets(const Options& o, Request* req) {
  google::protobuf::RepeatedPtrField<rl::v1::WeightBucket>* buckets = req->mutable_buckets();
  int64_t parent = -1;
  for (std::string line; std::getline(std::cin, line);) {
    if (line.find("\"names\"") == std::string::npos) continue;  // ready / summary lines
    auto parsed = weight_sync::ParseBucketLine(line);
    if (!parsed.ok()) return Annotate(parsed.status(), absl::StrCat("bucket ", buckets->size()));
    if (parsed->parent_version >= 0) {
      if (parent >= 0 && parent != parsed->parent_version) {
        return absl::InvalidArgumentError(absl::StrCat("bucket ", buckets->size(),
                                                       ": parent_version ", parsed->parent_version,
                                                       ", but an earlier line names ", parent));
      }
      parent = parsed->parent_version;
    }
    rl::v1::WeightBucket* b = buckets->Add();
    for (const auto& s : parsed->specs) {
      b->add_names(s.name);
      b->add_dtypes(s.dtype);
      b->add_shapes()->mutable_dims()->Assign(s.shape.begin(), s.shape.end());
    }
    for (const std::string& e : parsed->encodings) b->add_encodings(e);
    b->mutable_delta_counts()->Assign(parsed->delta_counts.begin(), parsed->delta_counts.end());
    b->mutable_payload_bytes()->Assign(parsed->payload_bytes.begin(), parsed->payload_bytes.end());
  }
  if (buckets->empty()) return absl::InvalidArgumentError("no bucket line on stdin");
  if (o.parent_version >= 0) {
    if (parent >= 0 && parent != o.parent_version) {
      return absl::InvalidArgumentError(absl::StrCat("--parent-version ", o.parent_version,
                                                     ", but the bucket lines name ", parent));
    }
    parent = o.parent_version;
  }
  if (parent >= 0) req->set_parent_version(parent);
  if (!o.manifest.empty()) {
    if (parent < 0) {
      return absl::InvalidArgumentError(
          "--manifest verifies a delta: give --parent-version (or bucket lines naming one)");
    }
    ASSIGN_OR_RETURN(std::string text, model_io::ReadSmallFile(o.manifest, kMaxManifestFileBytes));
    req->set_manifest_json(std::move(text));
  }
  return absl::OkStatus();
}

}  // namespace

// One UpdateWeightsFromDistributed call per bucket line (from --bucket-json, or from stdin as
// the lines arrive: the trainer broadcasts each bucket right after printing its line and waits
// for the workers, which receive it during this call).
int UpdateWeightsDistributed(const Options& o, const Client& c) {
  if (o.group_name.empty()) return Fail(o, Usage("update-weights --distributed --group-name G"));
  Json all = Json::array();
  int num_buckets = 0;
  bool all_ok = true;  // every bucket on every worker
  auto send = [&](const std::string& line) -> absl::Status {
    const int index = num_buckets++;
    ASSIGN_OR_RETURN(auto specs, weight_sync::ParseBucketJson(line));
    rl::v1::UpdateWeightsFromDistributedRequest req;
    req.set_group_name(o.group_name);
    for (const auto& s : specs) {
      req.add_names(s.name);
      req.add_dtypes(s.dtype);
      req.add_shapes()->mutable_dims()->Assign(s.shape.begin(), s.shape.end());
    }
    if (o.version >= 0) req.set_weight_version(o.version);
    req.set_abort_all_requests(o.abort_all);
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    rl::v1::AdminResponse resp;
    RETURN_IF_ERROR(FromGrpcStatus(c.admin()->UpdateWeightsFromDistributed(&ctx, req, &resp)));
    all_ok = all_ok && resp.success();
    if (o.json) {
      all.push_back(Json::parse(ToJson(resp)));
    } else {
      std::cout << "bucket " << index << " (" << specs.size() << " tensors): ";
      PrintAdmin(resp);
    }
    return absl::OkStatus();
  };
  if (!o.bucket_json.empty()) {
    if (absl::Status s = send(o.bucket_json); !s.ok()) return Fail(o, s);
  } else {
    for (std::string line; std::getline(std::cin, line);) {
      // rl-weight-sender also prints its ready line and a closing summary: skip them.
      if (line.find("\"names\"") == std::string::npos) continue;
      if (absl::Status s = send(line); !s.ok()) {
        return Fail(o, Annotate(s, absl::StrCat("bucket ", num_buckets - 1)));
      }
    }
  }
  if (num_buckets == 0) return Fail(o, absl::InvalidArgumentError("no bucket line on stdin"));
  if (o.json) std::cout << Json{{"buckets", all}}.dump() << "\n";
  return all_ok ? 0 : 1;  // a bucket that failed on some worker fails the command
}

int InitGroup(const Options& o, const Client& c) {
  if (o.master_address.empty() || o.master_port <= 0 || o.world_size < 2 || o.group_name.empty()) {
    return Fail(
        o, Usage("init-group --master-address A --master-port P --world-size N --group-name G"));
  }
  if (o.group_backend != "tcp" && o.group_backend != "nccl") {
    return Fail(o, Usage("init-group --backend tcp|nccl"));
  }
  rl::v1::InitWeightsUpdateGroupRequest req;
  req.set_master_address(o.master_address);
  req.set_master_port(o.master_port);
  req.set_rank_offset(o.rank_offset);
  req.set_world_size(o.world_size);
  req.set_group_name(o.group_name);
  req.set_backend(o.group_backend == "nccl" ? rl::v1::GROUP_BACKEND_NCCL
                                            : rl::v1::GROUP_BACKEND_TCP);
  req.set_timeout_ms(o.group_timeout_ms);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::InitWeightsUpdateGroup);
}

int DestroyGroup(const Options& o, const Client& c) {
  if (o.group_name.empty()) return Fail(o, Usage("destroy-group --group-name G"));
  rl::v1::DestroyWeightsUpdateGroupRequest req;
  req.set_group_name(o.group_name);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::DestroyWeightsUpdateGroup);
}

// Two-phase receive: prepare-weights posts the receive of the buckets read from stdin (answers
// once every worker listens), complete-weights applies them after the trainer broadcast;
// receive-weights does both in one call while the trainer broadcasts.
int PrepareWeights(const Options& o, const Client& c) {
  if (o.group_name.empty()) return Fail(o, Usage("prepare-weights --group-name G < buckets"));
  rl::v1::PrepareWeightsUpdateRequest req;
  req.set_group_name(o.group_name);
  if (absl::Status s = ReadBuckets(o, &req); !s.ok()) return Fail(o, s);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::PrepareWeightsUpdate);
}

int CompleteWeights(const Options& o, const Client& c) {
  if (o.group_name.empty()) return Fail(o, Usage("complete-weights --group-name G"));
  rl::v1::CompleteWeightsUpdateRequest req;
  req.set_group_name(o.group_name);
  if (o.version >= 0) req.set_weight_version(o.version);
  req.set_abort_all_requests(o.abort_all);
  req.set_keep_pause(o.keep_pause);
  req.set_stage(o.stage);
  req.set_keep_kv(o.keep_kv);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::CompleteWeightsUpdate);
}

int ReceiveWeights(const Options& o, const Client& c) {
  if (o.group_name.empty()) return Fail(o, Usage("receive-weights --group-name G < buckets"));
  rl::v1::ReceiveWeightsRequest req;
  req.set_group_name(o.group_name);
  if (absl::Status s = ReadBuckets(o, &req); !s.ok()) return Fail(o, s);
  if (o.version >= 0) req.set_weight_version(o.version);
  req.set_abort_all_requests(o.abort_all);
  req.set_keep_pause(o.keep_pause);
  req.set_stage(o.stage);
  req.set_keep_kv(o.keep_kv);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::ReceiveWeights);
}

}  // namespace rl::rlctl
