// Manifests: what a published weight version is. A publication names its version, its parent
// version (the one a delta applies to; absent for a root) and the SHA-256 digest of every tensor
// (the weights checker's digest: name, dtype, shape, bytes), plus the digest over those digests
// (the weights checker's rank digest), which is the version's identity: a version number never
// names two contents (docs/weight-publications.md).
//
// On disk: `rl-manifest.json` beside the checkpoint (or inside a delta file), one JSON object
//   {"format": "rlfleet.manifest.v1", "version": 7, "parent_version": 6,
//    "parent_sha256": "<hex>", "sha256": "<hex>",
//    "tensors": {"<name>": {"dtype": "BF16", "shape": [896, 4864], "sha256": "<hex>"}, ...}}
// `parent_version` / `parent_sha256` are optional; `sha256` must equal the digest recomputed over
// `tensors` (an edited manifest is refused). Parsing is bounded (file size, tensor count, name
// length, rank, element count) and every field is checked, errors name it.
// Cost: writing or verifying one hashes every tensor once (SHA-256, about 1.5 GB/s with SHA-NI).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/model_io/dtype.h"
#include "common/model_io/safetensors.h"

namespace rl::weight_sync {

inline constexpr char kManifestFileName[] = "rl-manifest.json";
inline constexpr char kManifestFormat[] = "rlfleet.manifest.v1";
inline constexpr int64_t kMaxManifestBytes = int64_t{64} << 20;
inline constexpr int64_t kMaxManifestTensors = 1 << 18;
inline constexpr size_t kMaxTensorNameBytes = 1024;
inline constexpr int kMaxManifestRank = 8;

struct ManifestEntry {
  model_io::DType dtype = model_io::DType::kF32;
  std::vector<int64_t> shape;
  std::string sha256;  // lower-case hex
};

struct Manifest {
  int64_t version = 0;
  std::optional<int64_t> parent_version;
  std::string parent_sha256;  // "" when not named
  std::map<std::string, ManifestEntry> tensors;
  std::string sha256;  // ManifestDigest(tensors)
};

// Hex SHA-256 over  name \0 dtype \0 shape \0 bytes  (the weights checker's tensor digest).
std::string TensorSha256(absl::string_view name, absl::string_view dtype,
                         absl::Span<const int64_t> shape, absl::Span<const uint8_t> bytes);
// Hex SHA-256 over the lines "name:sha256\n" in name order (the weights checker's rank digest).
std::string ManifestDigest(const std::map<std::string, ManifestEntry>& tensors);

// Parses and checks a manifest's JSON (`source` names it in errors).
absl::StatusOr<Manifest> ParseManifest(absl::string_view text, absl::string_view source);
std::string ManifestToJson(const Manifest& manifest);

// DIR/rl-manifest.json, or nullopt when DIR has none.
absl::StatusOr<std::optional<Manifest>> ReadManifest(const std::string& dir);
// Writes DIR/rl-manifest.json atomically (temp file + rename).
absl::Status WriteManifest(const std::string& dir, const Manifest& manifest);

// The manifest of an opened checkpoint: every F32 / BF16 / F16 tensor hashed (others are never
// served, and left out).
Manifest ManifestOfCheckpoint(const model_io::Checkpoint& checkpoint, int64_t version,
                              std::optional<int64_t> parent_version = std::nullopt,
                              std::string parent_sha256 = "");

// OK when tensor `name` with these dtype, shape and bytes is the manifest's; else
// FailedPrecondition naming the tensor and what differs (absent, dtype, shape, digest).
absl::Status CheckTensorAgainstManifest(const Manifest& manifest, const std::string& name,
                                        absl::string_view dtype, absl::Span<const int64_t> shape,
                                        absl::Span<const uint8_t> bytes);

}  // namespace rl::weight_sync
