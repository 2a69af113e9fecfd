// The end of a collection: the shards that checkpoint.json names, merged into one
// DIR/trajectories.safetensors (shard layout, shard.h) and DIR/manifest.json (its SHA256, the
// counts, whether the collection is complete). Each sample appears once, its newest record,
// sorted by (index, sample); records the checkpoint does not name (a shard written before a
// crash lost its checkpoint update) are left out. Both files are written durably.
// Cost: every shard is read into memory once, then one encode of the merged records.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "services/collector/checkpoint.h"

namespace rl::collector {

inline constexpr char kMergedName[] = "trajectories.safetensors";
inline constexpr char kManifestName[] = "manifest.json";

struct MergeSummary {
  int64_t num_samples = 0;
  int64_t num_failed = 0;
  int64_t num_tokens = 0;
  std::string path;
};

// Merges the shards that `checkpoint` names in `dir` into DIR/trajectories.safetensors and
// DIR/manifest.json.
absl::StatusOr<MergeSummary> MergeShards(const std::string& dir,
                                         const CollectCheckpoint& checkpoint);

}  // namespace rl::collector
