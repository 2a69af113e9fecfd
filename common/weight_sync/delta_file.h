// Delta files: a weight version published as the change from its parent, one file beside the
// checkpoint (`weights.rldelta`, with the child's `rl-manifest.json`; docs/weight-publications.md).
//
// Layout (little-endian):
//   8 bytes   magic "RLDELTA1"
//   8 bytes   u64 header length N (at most kMaxDeltaHeaderBytes)
//   N bytes   JSON header {"format": "rlfleet.delta.v1",
//               "manifest": {... the child's manifest: version, parent_version, sha256s ...},
//               "tensors": [{"name", "dtype", "encoding": "overwrite"|"xor", "count",
//                            "data_offsets": [begin, end]}, ...]}
//   data      the tensors' encoded payloads (delta.h), offsets relative to the data start,
//             tiling it in order without gap or overlap.
// The manifest must name a parent_version. A tensor of the manifest absent from `tensors` is
// unchanged from the parent. Every entry is checked before a byte is handed out: names unique
// and in the manifest with its dtype, count within the tensor's elements, offsets inside the
// data region; a file cut anywhere is refused (the header or the data region is short).
// Cost: reading holds the file in owned memory (payloads are views into it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_io/file_read.h"
#include "common/weight_sync/delta.h"
#include "common/weight_sync/manifest.h"

namespace rl::weight_sync {

inline constexpr char kDeltaFileName[] = "weights.rldelta";
inline constexpr char kDeltaFormat[] = "rlfleet.delta.v1";
inline constexpr int64_t kMaxDeltaHeaderBytes = int64_t{64} << 20;

struct DeltaTensor {
  std::string name;
  model_io::DType dtype = model_io::DType::kF32;
  DeltaView delta;  // payload: a view into DeltaFile::file
};

struct DeltaFile {
  Manifest manifest;  // the child's; parent_version always set
  std::vector<DeltaTensor> tensors;
  int64_t num_bytes = 0;  // the file's size
  std::shared_ptr<model_io::OwnedFile> file;
};

// Reads and checks `path` (at most `max_bytes`).
absl::StatusOr<DeltaFile> ReadDeltaFile(const std::string& path, int64_t max_bytes);
// Parses a delta file's bytes (tests, fuzzing); payload views point into `bytes`.
absl::StatusOr<DeltaFile> ParseDeltaFile(absl::Span<const uint8_t> bytes,
                                         const std::string& source);

struct NamedDelta {
  std::string name;
  model_io::DType dtype = model_io::DType::kF32;
  TensorDelta delta;
};
// Writes a delta file atomically (temp + rename). `manifest.parent_version` must be set.
absl::Status WriteDeltaFile(const std::string& path, const Manifest& manifest,
                            const std::vector<NamedDelta>& tensors);

struct DeltaPublicationStats {
  int64_t dense_bytes = 0;   // the child's tensor bytes
  int64_t delta_bytes = 0;   // the delta file's size
  int64_t num_elements = 0;  // elements of every tensor
  int64_t changed_elements = 0;
  int64_t num_overwrite = 0;  // tensors encoded each way (unchanged ones are left out)
  int64_t num_xor = 0;
};

// Publishes checkpoint `child_dir` as a delta of `parent_dir` into `out_dir` (created when
// missing): OUT/weights.rldelta and OUT/rl-manifest.json (the child's manifest, version
// `version`). The parent's version and digest come from PARENT/rl-manifest.json when present,
// else from `parent_version` and a digest computed here. Every tensor of the child must exist in
// the parent with its dtype and shape.
absl::StatusOr<DeltaPublicationStats> WriteDeltaPublication(const std::string& parent_dir,
                                                            const std::string& child_dir,
                                                            const std::string& out_dir,
                                                            int64_t version,
                                                            std::optional<int64_t> parent_version);

}  // namespace rl::weight_sync
