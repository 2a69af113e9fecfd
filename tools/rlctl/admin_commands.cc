// rlctl's one-shot admin commands: pause, continue, flush, release / resume memory,
// update-weights --from-disk, weights-checker, model-info, server-info, list-weights.
#include <map>
#include <string>

#include "tools/rlctl/commands.h"

namespace rl::rlctl {

int Pause(const Options& o, const Client& c) {
  static const std::map<std::string, rl::v1::PauseMode> kModes = {
      {"abort", rl::v1::PAUSE_MODE_ABORT},
      {"in_place", rl::v1::PAUSE_MODE_IN_PLACE},
      {"retract", rl::v1::PAUSE_MODE_RETRACT},
      {"drain", rl::v1::PAUSE_MODE_DRAIN}};
  auto it = kModes.find(o.mode);
  if (it == kModes.end()) {
    return Fail(o, Usage("pause --mode abort|in_place|retract|drain [--drain-timeout-ms T]"));
  }
  rl::v1::PauseGenerationRequest req;
  req.set_mode(it->second);
  if (o.drain_timeout_ms >= 0) req.set_drain_timeout_ms(o.drain_timeout_ms);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::PauseGeneration);
}

int Continue(const Options& o, const Client& c) {
  return AdminCall(o, c, rl::v1::ContinueGenerationRequest(),
                   &rl::v1::Admin::Stub::ContinueGeneration);
}

int Flush(const Options& o, const Client& c) {
  return AdminCall(o, c, rl::v1::FlushCacheRequest(), &rl::v1::Admin::Stub::FlushCache);
}

int ReleaseMemory(const Options& o, const Client& c) {
  return AdminCall(o, c, rl::v1::ReleaseMemoryRequest(), &rl::v1::Admin::Stub::ReleaseMemory);
}

int ResumeMemory(const Options& o, const Client& c) {
  return AdminCall(o, c, rl::v1::ResumeMemoryRequest(), &rl::v1::Admin::Stub::ResumeMemory);
}

int UpdateWeights(const Options& o, const Client& c) {
  if (o.distributed) return UpdateWeightsDistributed(o, c);
  if (o.from_disk.empty()) return Fail(o, Usage("update-weights --from-disk DIR | --distributed"));
  rl::v1::UpdateWeightsFromDiskRequest req;
  req.set_model_path(o.from_disk);
  if (o.version >= 0) req.set_weight_version(o.version);
  req.set_abort_all_requests(o.abort_all);
  req.set_keep_pause(o.keep_pause);
  req.set_keep_kv(o.keep_kv);
  req.set_flush_cache(!o.no_flush);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::UpdateWeightsFromDisk);
}

int StageWeights(const Options& o, const Client& c) {
  if (o.from_disk.empty()) return Fail(o, Usage("stage-weights --from-disk DIR [--version N]"));
  rl::v1::StageWeightsRequest req;
  req.set_model_path(o.from_disk);
  if (o.version >= 0) req.set_weight_version(o.version);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::StageWeights);
}

int ActivateWeights(const Options& o, const Client& c) {
  rl::v1::ActivateWeightsRequest req;
  if (o.version >= 0) req.set_weight_version(o.version);
  req.set_abort_all_requests(o.abort_all);
  req.set_keep_pause(o.keep_pause);
  req.set_keep_kv(o.keep_kv);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::ActivateWeights);
}

int DropStagedWeights(const Options& o, const Client& c) {
  return AdminCall(o, c, rl::v1::DropStagedWeightsRequest(),
                   &rl::v1::Admin::Stub::DropStagedWeights);
}

int RefitWeights(const Options& o, const Client& c) {
  if (o.from_disk.empty()) return Fail(o, Usage("refit --from-disk DIR [--version N]"));
  rl::v1::RefitWeightsRequest req;
  req.set_model_path(o.from_disk);
  if (o.version >= 0) req.set_weight_version(o.version);
  req.set_abort_all_requests(o.abort_all);
  req.set_keep_pause(o.keep_pause);
  req.set_keep_kv(o.keep_kv);
  return AdminCall(o, c, req, &rl::v1::Admin::Stub::RefitWeights);
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
  const int rc =
      Print<rl::v1::WeightsCheckerResponse>(o, c.admin()->WeightsChecker(&ctx, req, &resp), resp);
  return rc == 0 && !resp.success() ? 1 : rc;  // some worker failed
}

int ModelInfo(const Options& o, const Client& c) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  rl::v1::GetModelInfoResponse resp;
  const int rc = Print<rl::v1::GetModelInfoResponse>(
      o, c.admin()->GetModelInfo(&ctx, rl::v1::GetModelInfoRequest(), &resp), resp);
  // Through a router: a worker that did not answer fails the command.
  for (const auto& w : resp.workers()) {
    if (rc == 0 && !w.error().empty()) return 1;
  }
  return rc;
}

int ServerInfo(const Options& o, const Client& c) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  rl::v1::GetServerInfoResponse resp;
  const int rc = Print<rl::v1::GetServerInfoResponse>(
      o, c.admin()->GetServerInfo(&ctx, rl::v1::GetServerInfoRequest(), &resp), resp);
  // Through a router: a worker that did not answer fails the command.
  for (const auto& w : resp.workers()) {
    if (rc == 0 && !w.error().empty()) return 1;
  }
  return rc;
}

int ListWeights(const Options& o, const Client& c) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  rl::v1::ListWeightsResponse resp;
  return Print<rl::v1::ListWeightsResponse>(
      o, c.admin()->ListWeights(&ctx, rl::v1::ListWeightsRequest(), &resp), resp);
}

}  // namespace rl::rlctl
