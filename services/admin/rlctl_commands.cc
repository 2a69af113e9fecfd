#include "services/admin/rlctl_commands.h"

#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "common/model_io/model_maker.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "nlohmann/json.hpp"
#include "rl/v1/admin.grpc.pb.h"
#include "rl/v1/router.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"
#include "services/admin/rlctl_offline.h"
#include "services/worker/weight_sync/bucket_plan.h"

namespace rl::rlctl {
namespace {

using Json = nlohmann::json;

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(m, &out, options).ok()) out = "{}";
  return out;
}

// Prints an error (as {"error": {...}} with --json) and returns exit status 1 (2 for usage).
int Fail(const Options& o, const absl::Status& status) {
  const bool usage = status.code() == absl::StatusCode::kInvalidArgument &&
                     absl::StartsWith(status.message(), "usage:");
  if (o.json) {
    Json err = {{"error",
                 {{"code", absl::StatusCodeToString(status.code())},
                  {"message", std::string(status.message())}}}};
    std::cout << err.dump() << "\n";
  } else {
    std::cerr << "rlctl: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
              << "\n";
  }
  return usage ? 2 : 1;
}

absl::Status Usage(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("usage: ", what));
}

class Client {
 public:
  explicit Client(const Options& o) : o_(o) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(512 << 20);
    args.SetMaxSendMessageSize(512 << 20);
    channel_ = grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args);
  }
  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000)));
    if (!o_.api_key.empty()) ctx->AddMetadata("authorization", "Bearer " + o_.api_key);
  }
  std::unique_ptr<rl::v1::Admin::Stub> admin() const { return rl::v1::Admin::NewStub(channel_); }
  std::unique_ptr<rl::v1::Router::Stub> router() const { return rl::v1::Router::NewStub(channel_); }
  std::unique_ptr<rl::v1::Worker::Stub> worker() const { return rl::v1::Worker::NewStub(channel_); }
  std::unique_ptr<grpc::health::v1::Health::Stub> health() const {
    return grpc::health::v1::Health::NewStub(channel_);
  }

 private:
  const Options& o_;
  std::shared_ptr<grpc::Channel> channel_;
};

// Calls `rpc` and prints the response: JSON, or the human form from `human` (default: the
// JSON pretty-printed).
template <typename Response>
int Print(const Options& o, const grpc::Status& status, const Response& response,
          const std::function<void(const Response&)>& human = nullptr) {
  if (!status.ok()) return Fail(o, FromGrpcStatus(status));
  if (o.json || !human) {
    const std::string text = ToJson(response);
    std::cout << (o.json ? text : Json::parse(text).dump(2)) << "\n";
  } else {
    human(response);
  }
  return 0;
}

void PrintAdmin(const rl::v1::AdminResponse& r) {
  std::cout << (r.success() ? "ok" : "FAILED") << (r.message().empty() ? "" : ": ") << r.message()
            << " (weight_version " << r.weight_version() << ")\n";
  for (const auto& w : r.results()) {
    std::cout << "  " << w.worker() << "  " << w.code() << "  v" << w.weight_version() << "  "
              << w.message() << (w.left_out() ? "  [left out of routing]" : "") << "\n";
  }
}

// An admin call whose answer says success: false (a broadcast that failed on some worker)
// failed: the answer is printed as usual and the exit status is 1.
int PrintAdminResponse(const Options& o, const grpc::Status& status,
                       const rl::v1::AdminResponse& r) {
  const int rc = Print<rl::v1::AdminResponse>(o, status, r, PrintAdmin);
  return rc == 0 && !r.success() ? 1 : rc;
}

// One Admin call answered with an AdminResponse: calls `method` of the Admin stub with `req`
// under the client's deadline and key, prints the answer, returns the exit code.
template <typename Request>
int AdminCall(const Options& o, const Client& c, const Request& req,
              grpc::Status (rl::v1::Admin::Stub::*method)(grpc::ClientContext*, const Request&,
                                                          rl::v1::AdminResponse*)) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  rl::v1::AdminResponse resp;
  return PrintAdminResponse(o, (c.admin().get()->*method)(&ctx, req, &resp), resp);
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ids: '", std::string(part), "' is not an integer"));
    }
    ids.push_back(id);
  }
  return ids;
}

// Streams one generation. Tries rl.v1.Router first; a worker answers UNIMPLEMENTED for it, and
// then the same request goes to rl.v1.Worker.
int Generate(const Options& o, const Client& c, bool via_router = true) {
  rl::v1::GenerateRequest req;
  if (!o.text.empty() == !o.ids.empty())
    return Fail(o, Usage("generate needs exactly one of --text or --ids"));
  if (!o.text.empty()) {
    req.set_text(o.text);
  } else {
    auto ids = ParseIds(o.ids);
    if (!ids.ok()) return Fail(o, ids.status());
    for (int32_t id : *ids) req.mutable_input_ids()->add_ids(id);
  }
  auto* sp = req.mutable_sampling_params();
  if (o.max_new_tokens >= 0) sp->set_max_new_tokens(o.max_new_tokens);
  if (o.temperature >= 0) sp->set_temperature(static_cast<float>(o.temperature));
  if (o.top_p >= 0) sp->set_top_p(static_cast<float>(o.top_p));
  sp->set_top_k(o.top_k);
  if (o.seed >= 0) sp->set_seed(static_cast<uint64_t>(o.seed));
  for (const auto& s : o.stop) sp->add_stop(s);
  sp->set_ignore_eos(o.ignore_eos);
  // Logprob options imply --logprobs.
  req.set_return_logprob(o.logprobs || o.top_logprobs_num > 0 || o.logprob_start_len >= 0 ||
                         o.logprobs_at_temperature_one);
  req.set_top_logprobs_num(o.top_logprobs_num);
  if (o.logprob_start_len >= 0) req.set_logprob_start_len(o.logprob_start_len);
  req.set_logprobs_at_temperature_one(o.logprobs_at_temperature_one);
  req.set_return_trajectory(via_router && o.logprobs);
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  std::unique_ptr<grpc::ClientReader<rl::v1::GenerateResponse>> reader =
      via_router ? c.router()->Generate(&ctx, req) : c.worker()->Generate(&ctx, req);
  rl::v1::GenerateResponse msg, final_msg;
  bool have_final = false;
  while (reader->Read(&msg)) {
    if (msg.has_chunk() && !o.json) std::cout << msg.chunk().text() << std::flush;
    if (msg.has_final()) {
      final_msg = msg;
      have_final = true;
    }
  }
  const grpc::Status status = reader->Finish();
  if (via_router && status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return Generate(o, c, /*via_router=*/false);
  }
  if (!status.ok()) return Fail(o, FromGrpcStatus(status));
  if (!have_final) return Fail(o, absl::InternalError("stream ended without a final message"));
  if (o.json) {
    std::cout << ToJson(final_msg) << "\n";
  } else {
    const auto& f = final_msg.final();
    std::cout << "\n[" << rl::v1::FinishReason_Name(f.finish_reason()) << "] prompt "
              << f.prompt_tokens() << " tokens (" << f.cached_tokens() << " cached), completion "
              << f.completion_tokens() << " tokens, weight_version " << f.weight_version() << ", "
              << f.timings().total_us() / 1000.0 << " ms\n";
  }
  return 0;
}

int Workers(const Options& o, const Client& c, const std::vector<std::string>& args) {
  const std::string sub = args.size() > 1 ? args[1] : "list";
  auto stub = c.router();
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  rl::v1::WorkerListResponse resp;
  grpc::Status status;
  const bool needs_addr = sub != "list";
  if (needs_addr && args.size() < 3) return Fail(o, Usage("workers " + sub + " ADDR"));
  if (sub == "resync") {
    // Brings one worker (stale, or disabled with partial weights) to the fleet's version from a
    // folder: Admin.UpdateWeightsFromDisk with `workers` (admin_fanout.h).
    if (o.from_disk.empty()) return Fail(o, Usage("workers resync ADDR --from-disk DIR"));
    rl::v1::UpdateWeightsFromDiskRequest req;
    req.set_model_path(o.from_disk);
    if (o.version >= 0) req.set_weight_version(o.version);
    req.set_abort_all_requests(o.abort_all);
    req.add_workers(args[2]);
    rl::v1::AdminResponse admin_resp;
    return Print<rl::v1::AdminResponse>(o, c.admin()->UpdateWeightsFromDisk(&ctx, req, &admin_resp),
                                        admin_resp, PrintAdmin);
  }
  if (sub == "list") {
    status = stub->ListWorkers(&ctx, rl::v1::ListWorkersRequest(), &resp);
  } else if (sub == "add") {
    rl::v1::AddWorkerRequest req;
    req.set_address(args[2]);
    status = stub->AddWorker(&ctx, req, &resp);
  } else if (sub == "remove") {
    rl::v1::RemoveWorkerRequest req;
    req.set_address(args[2]);
    status = stub->RemoveWorker(&ctx, req, &resp);
  } else if (sub == "enable" || sub == "disable") {
    rl::v1::SetWorkerEnabledRequest req;
    req.set_address(args[2]);
    req.set_enabled(sub == "enable");
    status = stub->SetWorkerEnabled(&ctx, req, &resp);
  } else {
    return Fail(o, Usage("workers list|add ADDR|remove ADDR|enable ADDR|disable ADDR|resync ADDR "
                         "--from-disk DIR"));
  }
  return Print<rl::v1::WorkerListResponse>(o, status, resp, [](const auto& r) {
    for (const auto& w : r.workers()) {
      std::cout << w.address() << "  " << rl::v1::WorkerState_Name(w.state())
                << (w.enabled() ? "" : "  disabled") << "  in_flight " << w.in_flight() << "  v"
                << w.weight_version() << (w.version_mismatch() ? "  VERSION MISMATCH" : "")
                << (w.reason().empty() ? "" : "  (" + w.reason() + ")") << "\n";
    }
    if (!r.fleet_weight_source().empty()) {
      std::cout << "fleet weights: v" << r.fleet_weight_version() << " from "
                << r.fleet_weight_source() << "\n";
    }
  });
}

// One UpdateWeightsFromDistributed call per bucket line (from --bucket-json, or from stdin as
// the lines arrive: the trainer broadcasts each bucket right after printing its line and waits
// for the workers, which receive it during this call).
int UpdateWeightsDistributed(const Options& o, const Client& c) {
  if (o.group_name.empty()) return Fail(o, Usage("update-weights --distributed --group-name G"));
  Json all = Json::array();
  int num_buckets = 0;
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
  return 0;
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

// Every bucket line on stdin (as `rl-weight-sender --plan-only` prints them) into `buckets`.
absl::Status ReadBuckets(google::protobuf::RepeatedPtrField<rl::v1::WeightBucket>* buckets) {
  for (std::string line; std::getline(std::cin, line);) {
    if (line.find("\"names\"") == std::string::npos) continue;  // ready / summary lines
    auto specs = weight_sync::ParseBucketJson(line);
    if (!specs.ok()) return Annotate(specs.status(), absl::StrCat("bucket ", buckets->size()));
    rl::v1::WeightBucket* b = buckets->Add();
    for (const auto& s : *specs) {
      b->add_names(s.name);
      b->add_dtypes(s.dtype);
      b->add_shapes()->mutable_dims()->Assign(s.shape.begin(), s.shape.end());
    }
  }
  if (buckets->empty()) return absl::InvalidArgumentError("no bucket line on stdin");
  return absl::OkStatus();
}

// Two-phase receive: prepare-weights posts the receive of the buckets read from stdin (answers
// once every worker listens), complete-weights applies them after the trainer broadcast;
// receive-weights does both in one call while the trainer broadcasts.
int PrepareWeights(const Options& o, const Client& c) {
  if (o.group_name.empty()) return Fail(o, Usage("prepare-weights --group-name G < buckets"));
  rl::v1::PrepareWeightsUpdateRequest req;
  req.set_group_name(o.group_name);
  if (absl::Status s = ReadBuckets(req.mutable_buckets()); !s.ok()) return Fail(o, s);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::PrepareWeightsUpdate);
}

int CompleteWeights(const Options& o, const Client& c) {
  if (o.group_name.empty()) return Fail(o, Usage("complete-weights --group-name G"));
  rl::v1::CompleteWeightsUpdateRequest req;
  req.set_group_name(o.group_name);
  if (o.version >= 0) req.set_weight_version(o.version);
  req.set_abort_all_requests(o.abort_all);
  req.set_keep_pause(o.keep_pause);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::CompleteWeightsUpdate);
}

int ReceiveWeights(const Options& o, const Client& c) {
  if (o.group_name.empty()) return Fail(o, Usage("receive-weights --group-name G < buckets"));
  rl::v1::ReceiveWeightsRequest req;
  req.set_group_name(o.group_name);
  if (absl::Status s = ReadBuckets(req.mutable_buckets()); !s.ok()) return Fail(o, s);
  if (o.version >= 0) req.set_weight_version(o.version);
  req.set_abort_all_requests(o.abort_all);
  req.set_keep_pause(o.keep_pause);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::ReceiveWeights);
}

int UpdateWeights(const Options& o, const Client& c) {
  if (o.distributed) return UpdateWeightsDistributed(o, c);
  if (o.from_disk.empty()) return Fail(o, Usage("update-weights --from-disk DIR | --distributed"));
  rl::v1::UpdateWeightsFromDiskRequest req;
  req.set_model_path(o.from_disk);
  if (o.version >= 0) req.set_weight_version(o.version);
  req.set_abort_all_requests(o.abort_all);
  req.set_keep_pause(o.keep_pause);
  req.set_flush_cache(!o.no_flush);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::UpdateWeightsFromDisk);
}

int Pause(const Options& o, const Client& c) {
  static const std::map<std::string, rl::v1::PauseMode> kModes = {
      {"abort", rl::v1::PAUSE_MODE_ABORT},
      {"in_place", rl::v1::PAUSE_MODE_IN_PLACE},
      {"retract", rl::v1::PAUSE_MODE_RETRACT}};
  auto it = kModes.find(o.mode);
  if (it == kModes.end()) return Fail(o, Usage("pause --mode abort|in_place|retract"));
  rl::v1::PauseGenerationRequest req;
  req.set_mode(it->second);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::PauseGeneration);
}

int WeightsChecker(const Options& o, const Client& c) {
  static const std::map<std::string, rl::v1::WeightsCheckerAction> kActions = {
      {"snapshot", rl::v1::WEIGHTS_CHECKER_ACTION_SNAPSHOT},
      {"reset_tensors", rl::v1::WEIGHTS_CHECKER_ACTION_RESET_TENSORS},
      {"compare", rl::v1::WEIGHTS_CHECKER_ACTION_COMPARE},
      {"checksum", rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM}};
  auto it = kActions.find(o.action);
  if (it == kActions.end()) {
    return Fail(o, Usage("weights-checker --action snapshot|reset_tensors|compare|checksum"));
  }
  rl::v1::WeightsCheckerRequest req;
  req.set_action(it->second);
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  rl::v1::WeightsCheckerResponse resp;
  return Print<rl::v1::WeightsCheckerResponse>(o, c.admin()->WeightsChecker(&ctx, req, &resp),
                                               resp);
}

int Health(const Options& o, const Client& c) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status status =
      c.health()->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
  return Print<grpc::health::v1::HealthCheckResponse>(o, status, resp, [](const auto& r) {
    std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(r.status()) << "\n";
  });
}

int Metrics(const Options& o, const Client& c) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  rl::v1::GetMetricsResponse resp;
  const grpc::Status status = c.router()->GetMetrics(&ctx, rl::v1::GetMetricsRequest(), &resp);
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    // A worker: it has no Router service; its metrics are on its HTTP metrics port.
    return Fail(o, absl::FailedPreconditionError(absl::StrCat(
                       "metrics is for rl-router targets; ", o.target,
                       " has no rl.v1.Router service (an rl-worker?). A worker's metrics are "
                       "Prometheus text at http://HOST:METRICS_PORT/metrics (rl-worker "
                       "--metrics-port); `rlctl server-info` shows its engine state")));
  }
  return Print<rl::v1::GetMetricsResponse>(o, status, resp,
                                           [](const auto& r) { std::cout << r.prometheus_text(); });
}

// Router.Abort; a worker answers UNIMPLEMENTED for it, and then Worker.Abort gets the call.
int Abort(const Options& o, const Client& c) {
  if (o.all == !o.request_id.empty()) {
    return Fail(o, Usage("abort --request-id ID | --all"));
  }
  rl::v1::AbortRequest req;
  req.set_request_id(o.request_id);
  req.set_abort_all(o.all);
  rl::v1::AbortResponse resp;
  grpc::Status status;
  {
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    status = c.router()->Abort(&ctx, req, &resp);
  }
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    status = c.worker()->Abort(&ctx, req, &resp);
  }
  return Print<rl::v1::AbortResponse>(o, status, resp, [](const auto& r) {
    std::cout << "aborted " << r.num_aborted() << " request" << (r.num_aborted() == 1 ? "" : "s")
              << "\n";
  });
}

int MakeModel(const Options& o) {
  if (o.arch.empty() || o.size.empty() || o.out.empty()) {
    return Fail(
        o, Usage("make-model --arch llama|qwen2|qwen3|qwen3_moe --size tiny|0.5b|1b|8b --out DIR"));
  }
  model_io::MakeModelOptions m;
  m.arch = o.arch;
  m.size = o.size;
  m.seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : 0;
  m.dtype = o.dtype;
  m.out_dir = o.out;
  if (absl::Status s = model_io::MakeModel(m); !s.ok()) return Fail(o, s);
  Json out = {{"out", o.out}, {"arch", o.arch}, {"size", o.size}, {"seed", m.seed}};
  std::cout << (o.json ? out.dump() : "wrote " + o.arch + " " + o.size + " model to " + o.out)
            << "\n";
  return 0;
}

}  // namespace

int Run(const Options& o, const std::vector<std::string>& args) {
  const std::string& cmd = args[0];
  if (cmd == "make-model") return MakeModel(o);
  if (cmd == "tokenize" || cmd == "detokenize") {
    absl::Status s = cmd == "tokenize" ? Tokenize(o) : Detokenize(o);
    return s.ok() ? 0 : Fail(o, s);
  }
  Client c(o);
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  if (cmd == "generate") return Generate(o, c);
  if (cmd == "pause") return Pause(o, c);
  if (cmd == "continue") {
    return AdminCall(o, c, rl::v1::ContinueGenerationRequest(),
                     &rl::v1::Admin::Stub::ContinueGeneration);
  }
  if (cmd == "flush") {
    return AdminCall(o, c, rl::v1::FlushCacheRequest(), &rl::v1::Admin::Stub::FlushCache);
  }
  if (cmd == "release-memory") {
    return AdminCall(o, c, rl::v1::ReleaseMemoryRequest(), &rl::v1::Admin::Stub::ReleaseMemory);
  }
  if (cmd == "resume-memory") {
    return AdminCall(o, c, rl::v1::ResumeMemoryRequest(), &rl::v1::Admin::Stub::ResumeMemory);
  }
  if (cmd == "update-weights") return UpdateWeights(o, c);
  if (cmd == "weights-checker") return WeightsChecker(o, c);
  if (cmd == "init-group") return InitGroup(o, c);
  if (cmd == "destroy-group") return DestroyGroup(o, c);
  if (cmd == "prepare-weights") return PrepareWeights(o, c);
  if (cmd == "complete-weights") return CompleteWeights(o, c);
  if (cmd == "receive-weights") return ReceiveWeights(o, c);
  if (cmd == "model-info") {
    rl::v1::GetModelInfoResponse resp;
    return Print<rl::v1::GetModelInfoResponse>(
        o, c.admin()->GetModelInfo(&ctx, rl::v1::GetModelInfoRequest(), &resp), resp);
  }
  if (cmd == "server-info") {
    rl::v1::GetServerInfoResponse resp;
    return Print<rl::v1::GetServerInfoResponse>(
        o, c.admin()->GetServerInfo(&ctx, rl::v1::GetServerInfoRequest(), &resp), resp);
  }
  if (cmd == "list-weights") {
    rl::v1::ListWeightsResponse resp;
    return Print<rl::v1::ListWeightsResponse>(
        o, c.admin()->ListWeights(&ctx, rl::v1::ListWeightsRequest(), &resp), resp);
  }
  if (cmd == "retrieve") {
    if (o.text.empty()) return Fail(o, Usage("retrieve --text T"));
    rl::v1::RetrieveFromTextRequest req;
    req.set_text(o.text);
    rl::v1::RetrieveFromTextResponse resp;
    return Print<rl::v1::RetrieveFromTextResponse>(
        o, c.router()->RetrieveFromText(&ctx, req, &resp), resp);
  }
  if (cmd == "workers") return Workers(o, c, args);
  if (cmd == "metrics") return Metrics(o, c);
  if (cmd == "abort") return Abort(o, c);
  if (cmd == "health") return Health(o, c);
  return Fail(o, Usage("unknown command '" + cmd + "' (see rlctl --help)"));
}

int UsageError(bool json, const std::string& message) {
  if (json) {
    std::cout << Json{{"error", {{"code", "INVALID_ARGUMENT"}, {"message", message}}}}.dump()
              << "\n";
  } else {
    std::cerr << "rlctl: " << message << "\n";
  }
  return 2;
}

}  // namespace rl::rlctl
