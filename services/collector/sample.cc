#include "services/collector/sample.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status.h"

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

namespace {

// The R3 arrays of `r`, checked: three non-negative dims whose product matches the bytes, and
// tokens that fit in the record.
absl::Status FillRouting(const rl::v1::RoutedExperts& r, SampleRecord* record) {
  if (r.shape_size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("routed_experts: shape has ", r.shape_size(), " dims, expected 3"));
  }
  int64_t n = 1;
  for (int32_t d : r.shape()) {
    if (d < 0) return absl::InvalidArgumentError("routed_experts: negative dim");
    n *= d;
  }
  if (r.start_pos() < 0 || r.start_pos() + static_cast<int64_t>(r.shape(0)) >
                               static_cast<int64_t>(record->tokens.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("routed_experts: tokens [", r.start_pos(), ", ", r.start_pos() + r.shape(0),
                     ") beyond the sample's ", record->tokens.size(), " tokens"));
  }
  if (static_cast<int64_t>(r.expert_ids().size()) != n * 4 ||
      (!r.expert_weights().empty() && static_cast<int64_t>(r.expert_weights().size()) != n * 4)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "routed_experts: ", r.expert_ids().size(), " id bytes and ", r.expert_weights().size(),
        " weight bytes for shape [", r.shape(0), ", ", r.shape(1), ", ", r.shape(2), "]"));
  }
  record->routed_shape.assign(r.shape().begin(), r.shape().end());
  record->routed_start = r.start_pos();
  record->routed_experts.resize(static_cast<size_t>(n));
  std::memcpy(record->routed_experts.data(), r.expert_ids().data(), r.expert_ids().size());
  record->expert_weights.resize(r.expert_weights().size() / 4);
  std::memcpy(record->expert_weights.data(), r.expert_weights().data(), r.expert_weights().size());
  return absl::OkStatus();
}

}  // namespace

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
  if (final.has_routed_experts()) RETURN_IF_ERROR(FillRouting(final.routed_experts(), record));
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
    case rl::v1::FINISH_REASON_STALE:
      return "stale";
    default:
      return "unspecified";
  }
}

}  // namespace rl::collector
