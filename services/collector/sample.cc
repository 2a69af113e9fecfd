#include "services/collector/sample.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace rl::collector {

absl::StatusOr<std::vector<int64_t>> ExpandWeightVersions(const rl::v1::GenerateFinal& final) {
  const int64_t num_out = final.output_ids_size();
  std::vector<int64_t> out;
  if (final.weight_version_segments_size() == 0) {
    out.assign(static_cast<size_t>(num_out), final.weight_version());
    return out;
  }
  out.reserve(static_cast<size_t>(num_out));
  for (const rl::v1::VersionSegment& seg : final.weight_version_segments()) {
    if (seg.num_tokens() < 0 || static_cast<int64_t>(out.size()) + seg.num_tokens() > num_out) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight_version_segments cover more than the ", num_out, " output tokens"));
    }
    out.insert(out.end(), static_cast<size_t>(seg.num_tokens()), seg.weight_version());
  }
  if (static_cast<int64_t>(out.size()) != num_out) {
    return absl::InvalidArgumentError(absl::StrCat("weight_version_segments cover ", out.size(),
                                                   " of the ", num_out, " output tokens"));
  }
  return out;
}

absl::Status FillFromFinal(const rl::v1::GenerateFinal& final, SampleRecord* record) {
  const int num_out = final.output_ids_size();
  const rl::v1::Trajectory& t = final.trajectory();
  if (t.tokens_size() < num_out) {
    return absl::InvalidArgumentError(absl::StrCat("the final's trajectory has ", t.tokens_size(),
                                                   " tokens, fewer than its ", num_out,
                                                   " output tokens (was return_trajectory set?)"));
  }
  if (final.output_logprobs_size() != 0 && final.output_logprobs_size() != num_out) {
    return absl::InvalidArgumentError(absl::StrCat("the final has ", final.output_logprobs_size(),
                                                   " logprobs for ", num_out, " output tokens"));
  }
  auto versions = ExpandWeightVersions(final);
  if (!versions.ok()) return versions.status();
  const int prompt_len = t.tokens_size() - num_out;
  record->prompt_len = prompt_len;
  record->tokens.assign(t.tokens().begin(), t.tokens().begin() + prompt_len);
  record->tokens.insert(record->tokens.end(), final.output_ids().begin(), final.output_ids().end());
  record->loss_mask.assign(static_cast<size_t>(prompt_len), 0);
  record->loss_mask.insert(record->loss_mask.end(), static_cast<size_t>(num_out), 1);
  record->rollout_logprobs.assign(static_cast<size_t>(prompt_len),
                                  std::numeric_limits<float>::quiet_NaN());
  for (int i = 0; i < num_out; ++i) {
    record->rollout_logprobs.push_back(final.output_logprobs_size() != 0
                                           ? final.output_logprobs(i).logprob()
                                           : std::numeric_limits<float>::quiet_NaN());
  }
  record->weight_versions.assign(static_cast<size_t>(prompt_len), -1);
  record->weight_versions.insert(record->weight_versions.end(), versions->begin(), versions->end());
  record->finish_reason = FinishReasonName(final.finish_reason());
  record->weight_version = final.weight_version();
  record->text = final.text();
  return absl::OkStatus();
}

const char* FinishReasonName(rl::v1::FinishReason reason) {
  switch (reason) {
    case rl::v1::FINISH_REASON_STOP:
      return "stop";
    case rl::v1::FINISH_REASON_LENGTH:
      return "length";
    case rl::v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return "unspecified";
  }
}

}  // namespace rl::collector
