#include "services/worker/weights/weights_checker.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_io/dtype.h"
#include "common/sha256.h"
#include "common/status.h"

namespace rl::worker {

TensorHasher::TensorHasher(const model::TensorInfo& info) {
  const char zero = '\0';
  h_.Update(info.name);
  h_.Update(&zero, 1);
  h_.Update(info.dtype);
  h_.Update(&zero, 1);
  h_.Update(absl::StrJoin(info.shape, ","));
  h_.Update(&zero, 1);
}

std::string TensorDigest(const model::TensorInfo& info, absl::Span<const uint8_t> bytes) {
  TensorHasher h(info);
  h.Update(bytes);
  return h.Finish();
}

std::string RankDigest(const std::map<std::string, std::string>& tensor_digests) {
  Sha256 h;
  for (const auto& [name, digest] : tensor_digests) h.Update(absl::StrCat(name, ":", digest, "\n"));
  return ToHex(h.Final());
}

absl::StatusOr<std::map<std::string, std::string>> WeightsChecker::Digests(
    const model::ModelRunner& runner) {
  std::map<std::string, std::string> out;
  RETURN_IF_ERROR(
      runner.VisitWeights([&](const model::TensorInfo& info, absl::Span<const uint8_t> bytes) {
        out[info.name] = TensorDigest(info, bytes);
      }));
  return out;
}

absl::StatusOr<CheckerResult> WeightsChecker::Snapshot(const model::ModelRunner& runner) {
  ASSIGN_OR_RETURN(snapshot_, Digests(runner));
  has_snapshot_ = true;
  CheckerResult r;
  r.message = absl::StrCat("snapshot of ", snapshot_.size(), " tensors");
  return r;
}

absl::StatusOr<CheckerResult> WeightsChecker::ResetTensors(model::ModelRunner& runner,
                                                           uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  int64_t count = 0;
  for (const model::TensorInfo& info : runner.ListWeights()) {
    const std::optional<model_io::DType> dtype = model_io::ParseDType(info.dtype);
    if (!dtype) return absl::InternalError(absl::StrCat(info.name, ": dtype ", info.dtype));
    int64_t numel = 1;
    for (int64_t d : info.shape) numel *= d;
    std::vector<float> values(static_cast<size_t>(numel));
    for (float& v : values) v = dist(rng);
    std::vector<uint8_t> bytes(static_cast<size_t>(numel * model_io::DTypeSize(*dtype)));
    model_io::ConvertFromF32(values.data(), numel, *dtype, bytes.data());
    RETURN_IF_ERROR(runner.UpdateWeight(info, bytes));
    ++count;
  }
  CheckerResult r;
  r.message = absl::StrCat("reset ", count, " tensors");
  return r;
}

absl::StatusOr<CheckerResult> WeightsChecker::Compare(const model::ModelRunner& runner) const {
  if (!has_snapshot_) {
    return absl::FailedPreconditionError("compare: take a snapshot first (action snapshot)");
  }
  ASSIGN_OR_RETURN(auto now, Digests(runner));
  CheckerResult r;
  for (const auto& [name, digest] : snapshot_) {
    auto it = now.find(name);
    if (it == now.end()) {
      r.missing.push_back(name);
    } else if (it->second != digest) {
      r.changed.push_back(name);
    }
  }
  for (const auto& [name, digest] : now) {
    if (!snapshot_.contains(name)) r.unexpected.push_back(name);
  }
  r.message = absl::StrCat(r.changed.size(), " changed, ", r.missing.size(), " missing, ",
                           r.unexpected.size(), " unexpected of ", snapshot_.size(), " tensors");
  return r;
}

absl::StatusOr<CheckerResult> WeightsChecker::Checksum(const model::ModelRunner& runner) {
  CheckerResult r;
  ASSIGN_OR_RETURN(r.tensor_sha256, Digests(runner));
  r.rank_sha256 = RankDigest(r.tensor_sha256);
  r.message = absl::StrCat("checksum of ", r.tensor_sha256.size(), " tensors");
  return r;
}

}  // namespace rl::worker
