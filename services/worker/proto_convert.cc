#include "services/worker/proto_convert.h"

#include <bit>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace rl::worker {

absl::StatusOr<engine::GenerateRequest> ToEngineRequest(const rl::v1::GenerateRequest& proto,
                                                        std::string id,
                                                        std::vector<int32_t> input_ids) {
  const rl::v1::SamplingParams& sp = proto.sampling_params();
  engine::GenerateRequest r;
  r.id = std::move(id);
  r.input_ids = std::move(input_ids);
  engine::SamplingParams& s = r.sampling;
  s.max_new_tokens = sp.has_max_new_tokens() ? sp.max_new_tokens() : kDefaultMaxNewTokens;
  s.min_new_tokens = sp.min_new_tokens();
  s.temperature = sp.has_temperature() ? sp.temperature() : 1.0;
  s.top_p = sp.has_top_p() ? sp.top_p() : 1.0;
  s.top_k = sp.top_k();
  s.min_p = sp.min_p();
  s.repetition_penalty = sp.has_repetition_penalty() ? sp.repetition_penalty() : 1.0;
  s.frequency_penalty = sp.frequency_penalty();
  s.presence_penalty = sp.presence_penalty();
  if (sp.has_seed()) s.seed = sp.seed();
  s.stop_token_ids.assign(sp.stop_token_ids().begin(), sp.stop_token_ids().end());
  s.stop.assign(sp.stop().begin(), sp.stop().end());
  s.ignore_eos = sp.ignore_eos();
  s.n = sp.has_n() ? sp.n() : 1;
  r.return_logprob = proto.return_logprob();
  r.top_logprobs_num = proto.top_logprobs_num();
  r.logprob_start_len = proto.has_logprob_start_len() ? proto.logprob_start_len() : -1;
  r.logprobs_at_temperature_one = proto.logprobs_at_temperature_one();
  if (r.top_logprobs_num != 0 && !r.return_logprob) {
    return absl::InvalidArgumentError("top_logprobs_num: needs return_logprob");
  }
  if (r.logprob_start_len >= 0 && !r.return_logprob) {
    return absl::InvalidArgumentError("logprob_start_len: needs return_logprob");
  }
  r.versions = VersionConstraintOf(proto);
  RETURN_IF_ERROR(r.versions.Validate());
  if (proto.has_max_version_lag()) r.max_version_lag = proto.max_version_lag();
  if (proto.has_resume_from()) {
    const rl::v1::ResumeFrom& rf = proto.resume_from();
    if (!rf.request_id().empty()) {
      return absl::InvalidArgumentError(
          "resume_from.request_id: resuming by request id is the router's (it keeps the partial "
          "samples); a worker resumes by output_ids with the original prompt");
    }
    if (rf.output_ids().empty()) {
      return absl::InvalidArgumentError(
          "resume_from: set output_ids (the earlier output) with the original prompt");
    }
    if (!sp.has_max_new_tokens()) {
      return absl::InvalidArgumentError(
          "sampling_params.max_new_tokens: a resume must give the sample's ORIGINAL budget");
    }
    r.resumed_ids.assign(rf.output_ids().begin(), rf.output_ids().end());
    r.resumed_logprobs.assign(rf.output_logprobs().begin(), rf.output_logprobs().end());
    for (const rl::v1::VersionSegment& seg : rf.weight_version_segments()) {
      r.resumed_segments.push_back({seg.weight_version(), seg.num_tokens()});
    }
  }
  r.return_routed_experts = proto.return_routed_experts();
  r.return_expert_weights = proto.return_expert_weights();
  r.routed_experts_start_len =
      proto.has_routed_experts_start_len() ? proto.routed_experts_start_len() : 0;
  if (proto.has_routed_experts_start_len() && !r.return_routed_experts) {
    return absl::InvalidArgumentError("routed_experts_start_len: needs return_routed_experts");
  }
  return r;
}

void ToProto(const engine::TokenLogprob& in, rl::v1::TokenLogprob* out) {
  out->set_token_id(in.token_id);
  out->set_logprob(static_cast<float>(in.logprob));
  for (const engine::TopLogprob& t : in.top) {
    rl::v1::TopLogprob* p = out->add_top();
    p->set_token_id(t.token_id);
    p->set_logprob(static_cast<float>(t.logprob));
  }
}

rl::v1::FinishReason ToProto(engine::FinishKind kind) {
  switch (kind) {
    case engine::FinishKind::kStop:
      return rl::v1::FINISH_REASON_STOP;
    case engine::FinishKind::kLength:
      return rl::v1::FINISH_REASON_LENGTH;
    case engine::FinishKind::kAbort:
      return rl::v1::FINISH_REASON_ABORT;
    case engine::FinishKind::kStale:
      return rl::v1::FINISH_REASON_STALE;
  }
  return rl::v1::FINISH_REASON_UNSPECIFIED;
}

void ToProto(const engine::GenerateResult& in, rl::v1::GenerateFinal* out) {
  out->set_finish_reason(ToProto(in.finish_reason.kind));
  out->set_matched_token_id(in.finish_reason.matched_token_id);
  out->set_matched_stop(in.finish_reason.matched_stop);
  if (in.finish_reason.kind == engine::FinishKind::kAbort ||
      in.finish_reason.kind == engine::FinishKind::kStale) {
    out->set_abort_message(in.finish_reason.message);
  }
  out->mutable_output_ids()->Assign(in.output_ids.begin(), in.output_ids.end());
  for (const auto& lp : in.output_logprobs) ToProto(lp, out->add_output_logprobs());
  for (const auto& lp : in.prompt_logprobs) ToProto(lp, out->add_prompt_logprobs());
  out->set_prompt_tokens(in.prompt_tokens);
  out->set_completion_tokens(in.completion_tokens);
  out->set_cached_tokens(in.cached_tokens);
  out->set_weight_version(in.weight_version);
  out->set_dispatch_weight_version(in.dispatch_weight_version);
  for (const engine::VersionSegment& seg : in.weight_version_segments) {
    rl::v1::VersionSegment* v = out->add_weight_version_segments();
    v->set_weight_version(seg.weight_version);
    v->set_num_tokens(seg.num_tokens);
  }
  out->set_kv_from_older_version(in.kv_from_older_version);
  out->set_oldest_kv_weight_version(in.oldest_kv_weight_version);
  out->set_resumed_tokens(in.resumed_tokens);
  if (in.routed_top_k > 0) ToProto(in, out->mutable_routed_experts());
  out->mutable_timings()->set_queue_us(in.timings.queue_us);
  out->mutable_timings()->set_ttft_us(in.timings.ttft_us);
  out->mutable_timings()->set_total_us(in.timings.total_us);
}

void ToProto(const engine::GenerateResult& in, rl::v1::RoutedExperts* out) {
  static_assert(std::endian::native == std::endian::little, "raw bytes are little-endian");
  const int64_t width = static_cast<int64_t>(in.routed_num_layers) * in.routed_top_k;
  const int64_t tokens = width == 0 ? 0 : static_cast<int64_t>(in.routed_experts.size()) / width;
  out->set_expert_ids(reinterpret_cast<const char*>(in.routed_experts.data()),
                      in.routed_experts.size() * sizeof(int32_t));
  out->set_expert_weights(reinterpret_cast<const char*>(in.expert_weights.data()),
                          in.expert_weights.size() * sizeof(float));
  out->add_shape(static_cast<int32_t>(tokens));
  out->add_shape(in.routed_num_layers);
  out->add_shape(in.routed_top_k);
  out->set_start_pos(in.routed_experts_start);
}

void ToProto(const engine::ServerInfo& in, rl::v1::GetServerInfoResponse* out) {
  out->set_paused(in.paused);
  out->set_pause_mode(ToProto(in.pause_mode));
  out->set_num_running(in.scheduler.num_running);
  for (const auto& id : in.running_ids) out->add_running_ids(id);
  out->set_num_waiting(in.scheduler.num_waiting);
  out->set_num_held(in.scheduler.num_held);
  out->set_kv_tokens_total(in.scheduler.total_kv_tokens);
  out->set_kv_tokens_available(in.scheduler.available_kv_tokens);
  out->set_tree_cache_tokens(in.scheduler.tree_cache_tokens);
  out->set_req_to_token_slots_used(in.scheduler.req_to_token_used);
  out->set_forward_ct_decode(in.scheduler.forward_ct_decode);
  out->set_new_token_ratio(in.scheduler.new_token_ratio);
  out->set_weight_version(in.weight_version);
  out->set_backend(in.backend);
  out->set_num_finished(in.scheduler.num_finished);
  out->set_cache_hit_tokens(in.scheduler.cache_hit_tokens);
}

absl::StatusOr<engine::PauseMode> FromProto(rl::v1::PauseMode mode) {
  switch (mode) {
    case rl::v1::PAUSE_MODE_ABORT:
      return engine::PauseMode::kAbort;
    case rl::v1::PAUSE_MODE_IN_PLACE:
      return engine::PauseMode::kInPlace;
    case rl::v1::PAUSE_MODE_RETRACT:
      return engine::PauseMode::kRetract;
    case rl::v1::PAUSE_MODE_DRAIN:
      return engine::PauseMode::kDrain;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("mode: must be PAUSE_MODE_ABORT, PAUSE_MODE_IN_PLACE, PAUSE_MODE_RETRACT or "
                       "PAUSE_MODE_DRAIN (got ",
                       static_cast<int>(mode), ")"));
  }
}

rl::v1::PauseMode ToProto(engine::PauseMode mode) {
  switch (mode) {
    case engine::PauseMode::kAbort:
      return rl::v1::PAUSE_MODE_ABORT;
    case engine::PauseMode::kInPlace:
      return rl::v1::PAUSE_MODE_IN_PLACE;
    case engine::PauseMode::kRetract:
      return rl::v1::PAUSE_MODE_RETRACT;
    case engine::PauseMode::kDrain:
      return rl::v1::PAUSE_MODE_DRAIN;
    case engine::PauseMode::kNone:
      break;
  }
  return rl::v1::PAUSE_MODE_UNSPECIFIED;
}

void ToProto(const model_io::ModelConfig& c, rl::v1::GetModelInfoResponse* out) {
  out->set_architecture(c.architecture_name);
  out->set_model_type(c.model_type);
  out->set_vocab_size(c.vocab_size);
  out->set_hidden_size(c.hidden_size);
  out->set_intermediate_size(c.intermediate_size);
  out->set_num_hidden_layers(c.num_hidden_layers);
  out->set_num_attention_heads(c.num_attention_heads);
  out->set_num_key_value_heads(c.num_key_value_heads);
  out->set_head_dim(c.head_dim);
  out->set_max_position_embeddings(c.max_position_embeddings);
  out->set_dtype(c.torch_dtype);
  out->set_tie_word_embeddings(c.tie_word_embeddings);
  for (int32_t id : c.eos_token_ids) out->add_eos_token_ids(id);
}

void FillModelInfo(const model_io::ModelConfig& config, const ModelIdentity& identity,
                   int64_t weight_version, rl::v1::GetModelInfoResponse* out) {
  ToProto(config, out);
  out->set_model_path(identity.model_path);
  out->set_weight_version(weight_version);
  out->set_backend(identity.backend);
  out->set_num_parameters(identity.num_parameters);
  out->set_config_json(identity.config_json);
}

void FillServerInfo(const engine::ServerInfo& engine, const WorkerInfo& worker,
                    rl::v1::GetServerInfoResponse* out) {
  ToProto(engine, out);
  out->set_asleep(worker.asleep);
  out->set_backend(worker.backend);
  out->set_version(worker.version);
  out->set_update_failed(worker.update_failed);
  out->set_last_error(worker.last_error);
  for (const std::string& name : worker.weight_update_groups) out->add_weight_update_groups(name);
  out->set_has_staged_weights(worker.staged.has_staged);
  out->set_staged_weight_version(worker.staged.version);
  out->set_staged_source(worker.staged.source);
  out->set_staged_bytes(worker.staged.bytes);
  out->set_staging(worker.staged.staging);
  out->set_staged_weights_sha256(worker.staged.sha256);
  out->set_staged_parent_version(worker.staged.parent_version);
}

}  // namespace rl::worker
