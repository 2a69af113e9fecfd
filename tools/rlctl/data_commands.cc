// rlctl's data-plane commands: generate, retrieve, episode, abort, health, metrics.
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/rlctl/commands.h"

namespace rl::rlctl {
namespace {

// Streams one generation. Tries rl.v1.Router first; a worker answers UNIMPLEMENTED for it, and
// then the same request goes to rl.v1.Worker.
int GenerateVia(const Options& o, const Client& c, bool via_router) {
  rl::v1::GenerateRequest req;
  if (!o.resume_id.empty()) {
    // Resume by request id (router only): the router keeps the prompt, the original budget
    // and the earlier output of a request that ended abort or stale.
    if (!o.text.empty() || !o.ids.empty()) {
      return Fail(o, Usage("generate --resume-id ID takes no --text or --ids (the router keeps "
                           "the prompt)"));
    }
    req.mutable_resume_from()->set_request_id(o.resume_id);
  } else if (!o.text.empty() == !o.ids.empty()) {
    return Fail(o, Usage("generate needs exactly one of --text or --ids (or --resume-id)"));
  }
  if (!o.text.empty()) {
    req.set_text(o.text);
  } else if (!o.ids.empty()) {
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
  if (o.min_weight_version >= 0) req.set_min_weight_version(o.min_weight_version);
  if (o.exact_weight_version >= 0) req.set_exact_weight_version(o.exact_weight_version);
  if (o.max_version_lag != kUnsetVersionLag) req.set_max_version_lag(o.max_version_lag);
  req.set_request_id(o.request_id);
  if (!o.resume_id.empty()) {
    req.clear_sampling_params();  // the kept sample's own
    if (!via_router) {
      return Fail(o, absl::FailedPreconditionError(
                         "generate --resume-id: resuming by request id needs an rl-router (it "
                         "keeps the partial samples); this is a worker"));
    }
  }
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
    return GenerateVia(o, c, /*via_router=*/false);
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
              << f.timings().total_us() / 1000.0 << " ms";
    if (f.resumed_tokens() > 0) {
      std::cout << ", resumed " << f.resumed_tokens() << " tokens"
                << (f.resumed_from_request_id().empty()
                        ? std::string()
                        : absl::StrCat(" of ", f.resumed_from_request_id()));
    }
    std::cout << "\n";
  }
  return 0;
}

}  // namespace

int Generate(const Options& o, const Client& c) { return GenerateVia(o, c, /*via_router=*/true); }

int Retrieve(const Options& o, const Client& c) {
  if (o.text.empty()) return Fail(o, Usage("retrieve --text T"));
  rl::v1::RetrieveFromTextRequest req;
  req.set_text(o.text);
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  rl::v1::RetrieveFromTextResponse resp;
  return Print<rl::v1::RetrieveFromTextResponse>(o, c.router()->RetrieveFromText(&ctx, req, &resp),
                                                 resp);
}

int Episode(const Options& o, const Client& c) {
  if (o.episode_id.empty()) {
    return Fail(o,
                Usage("episode --episode-id ID [--remove] [--routed-experts [--expert-weights]]"));
  }
  rl::v1::GetEpisodeRequest req;
  req.set_episode_id(o.episode_id);
  req.set_remove(o.remove);
  req.set_return_routed_experts(o.routed_experts);
  req.set_return_expert_weights(o.expert_weights);
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  rl::v1::GetEpisodeResponse resp;
  return Print<rl::v1::GetEpisodeResponse>(
      o, c.router()->GetEpisode(&ctx, req, &resp), resp, [](const auto& r) {
        std::cout << "episode " << r.episode_id() << ": " << r.turns_size() << " turns, "
                  << r.samples_size() << " samples\n";
        for (int i = 0; i < r.turns_size(); ++i) {
          const auto& t = r.turns(i);
          std::cout << "  turn " << i << " parent " << t.parent() << ": prompt "
                    << t.prompt_tokens() << " tokens, completion " << t.completion_tokens()
                    << " tokens, v" << t.weight_version() << " on " << t.worker() << "\n";
        }
        for (const auto& s : r.samples()) {
          int generated = 0;
          for (int m : s.trajectory().loss_mask()) generated += m;
          std::cout << "  sample (turns";
          for (int t : s.turns()) std::cout << " " << t;
          std::cout << "): " << s.trajectory().tokens_size() << " tokens, " << generated
                    << " generated";
          if (s.has_routed_experts()) {
            const auto& re = s.routed_experts();
            std::cout << ", routed experts [" << absl::StrJoin(re.shape(), ", ") << "] from token "
                      << re.start_pos();
          }
          std::cout << "\n";
        }
      });
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

}  // namespace rl::rlctl
