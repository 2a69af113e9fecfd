// WeightsChecker: verifies that weight updates really rewrite the served tensors (the
// WeightsChecker admin call; the control plane runs it on the engine thread).
//
//   snapshot       remember a SHA256 digest of every tensor (digests, not copies: O(1) memory
//                  per tensor, O(model bytes) hashing time)
//   reset_tensors  overwrite every tensor with seeded random values in [-1, 1)
//   compare        tensors missing since the snapshot, unexpected (new), changed (digest)
//   checksum       per-tensor digests and the rank digest
//
// Tensor digest: SHA256 over  name '\0' dtype '\0' shape '\0' bytes  where dtype is the
// safetensors spelling ("BF16"), shape the decimal dims joined by ',' and bytes the raw
// little-endian values as held. Rank digest: SHA256 over the lines "name:hexdigest\n" in name
// order. A checkpoint file therefore gives the same digests as the worker that loaded it
// (docs/weight-updates.md). Not thread-safe: called on the engine thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sha256.h"
#include "services/worker/model/model_runner.h"

namespace rl::worker {

struct CheckerResult {
  std::string message;
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  std::vector<std::string> changed;
  std::map<std::string, std::string> tensor_sha256;  // checksum only
  std::string rank_sha256;                           // checksum only
};

// Hex SHA256 of one tensor as described above.
std::string TensorDigest(const model::TensorInfo& info, absl::Span<const uint8_t> bytes);
// The same digest over bytes that arrive in pieces, in order (a peer send hashes slices).
class TensorHasher {
 public:
  explicit TensorHasher(const model::TensorInfo& info);
  void Update(absl::Span<const uint8_t> bytes) { h_.Update(bytes.data(), bytes.size()); }
  std::string Finish() { return ToHex(h_.Final()); }

 private:
  Sha256 h_;
};
// Hex SHA256 over the sorted "name:digest" lines.
std::string RankDigest(const std::map<std::string, std::string>& tensor_digests);

class WeightsChecker {
 public:
  absl::StatusOr<CheckerResult> Snapshot(const model::ModelRunner& runner);
  absl::StatusOr<CheckerResult> ResetTensors(model::ModelRunner& runner, uint64_t seed);
  // FAILED_PRECONDITION without a snapshot.
  absl::StatusOr<CheckerResult> Compare(const model::ModelRunner& runner) const;
  static absl::StatusOr<CheckerResult> Checksum(const model::ModelRunner& runner);

 private:
  static absl::StatusOr<std::map<std::string, std::string>> Digests(
      const model::ModelRunner& runner);
  std::map<std::string, std::string> snapshot_;
  bool has_snapshot_ = false;
};

}  // namespace rl::worker
