// The resume path of Generation (issue 34; docs/weight-updates.md, "Resume"), kept apart from
// generation.cc: resolving a resume by request id from the ResumeStore into a resume by tokens,
// the decoders' context for the earlier output, and keeping a partial sample that ended ABORT
// or STALE so it can be resumed by id. A resume by tokens is sent to the worker as it came:
// the worker continues it and its final holds both parts.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/router/generation.h"

namespace rl::router {

std::string Generation::ResumeKey(const std::string& request_id, int index, int n) {
  return n > 1 ? absl::StrCat(request_id, "#", index) : request_id;
}

absl::StatusOr<rl::v1::GenerateRequest> Generation::ResolveResume(
    const rl::v1::GenerateRequest& request, ResumeStore* store) {
  if (!request.has_resume_from() || request.resume_from().request_id().empty()) {
    if (request.has_resume_from() && request.resume_from().output_ids().empty()) {
      return absl::InvalidArgumentError(
          "resume_from: set request_id (a sample the router keeps) or output_ids with the "
          "original prompt");
    }
    if (request.has_resume_from() && !request.sampling_params().has_max_new_tokens()) {
      return absl::InvalidArgumentError(
          "sampling_params.max_new_tokens: a resume must give the sample's ORIGINAL budget");
    }
    return request;
  }
  if (request.prompt_case() != rl::v1::GenerateRequest::PROMPT_NOT_SET) {
    return absl::InvalidArgumentError(
        "resume_from.request_id: leave the prompt empty (the router resumes the kept one)");
  }
  if (store == nullptr || !store->enabled()) {
    return absl::FailedPreconditionError(
        "resume_from.request_id: this router keeps no partial samples (--resume-store-entries "
        "0): resume by output_ids with the prompt");
  }
  ASSIGN_OR_RETURN(rl::v1::GenerateRequest kept, store->Get(request.resume_from().request_id()));
  // The kept prompt, original sampling params and earlier output; the rest (request id,
  // streaming, logprobs, versions, routing, episode) is this request's.
  rl::v1::GenerateRequest out = request;
  *out.mutable_input_ids() = kept.input_ids();
  *out.mutable_sampling_params() = kept.sampling_params();
  *out.mutable_resume_from() = kept.resume_from();
  return out;
}

void Generation::PrimeResumed(Completion* c) const {
  if (!request_.has_resume_from()) return;
  for (int32_t id : request_.resume_from().output_ids()) {
    auto delta = c->decoder->Step(id);
    AppendCompletionDelta(delta.ok() ? *delta : "", &c->text, &c->ends);
  }
  c->streamed_bytes = c->text.size();  // the earlier part's text is in the final only
}

void Generation::OnResumeFinal(size_t index, rl::v1::GenerateFinal* f) {
  if (!resumed_from_id_.empty()) {
    f->set_resumed_from_request_id(resumed_from_id_);
    if (env_->resume_store != nullptr) env_->resume_store->Erase(resumed_from_id_);
  }
  const bool partial = f->finish_reason() == rl::v1::FINISH_REASON_ABORT ||
                       f->finish_reason() == rl::v1::FINISH_REASON_STALE;
  if (!partial || f->output_ids_size() == 0 || env_->resume_store == nullptr) return;
  const int n = std::max(request_.sampling_params().n(), 1);
  rl::v1::GenerateRequest keep;
  keep.mutable_input_ids()->mutable_ids()->Assign(prompt_.ids.begin(), prompt_.ids.end());
  *keep.mutable_sampling_params() = request_.sampling_params();
  keep.mutable_sampling_params()->set_n(1);
  if (!keep.sampling_params().has_max_new_tokens()) {
    // The worker's default budget was what it ran under: a continuation needs it explicit.
    keep.mutable_sampling_params()->set_max_new_tokens(kWorkerDefaultMaxNewTokens);
  }
  rl::v1::ResumeFrom* rf = keep.mutable_resume_from();
  *rf->mutable_output_ids() = f->output_ids();
  for (const rl::v1::TokenLogprob& lp : f->output_logprobs()) rf->add_output_logprobs(lp.logprob());
  *rf->mutable_weight_version_segments() = f->weight_version_segments();
  env_->resume_store->Put(ResumeKey(request_id_, static_cast<int>(index), n), std::move(keep));
}

}  // namespace rl::router
