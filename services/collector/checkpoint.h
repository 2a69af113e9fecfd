// checkpoint.json: the collector's durable progress in its output folder.
//
// {"format": "rlfleet.collect.checkpoint.v1", "prompts_sha256": ..., "n": N, "total": rows*N,
//  "shards": ["shard_00000.safetensors", ...],
//  "completed": [[first_index, last_index, sample], ...],  // saved with status "ok"
//  "failed": [[first_index, last_index, sample], ...]}     // saved with an error status
// (runs of consecutive indices with one sample number; failed samples are retried on resume).
// Written with WriteFileDurably after every shard, so it only ever names shards that are
// already on disk; a crash loses at most the samples not yet in a shard.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/collector/sample_set.h"

namespace rl::collector {

struct CollectCheckpoint {
  std::string prompts_sha256;
  int32_t n = 1;
  int64_t total = 0;
  std::vector<std::string> shards;
  SampleSet completed;
  SampleSet failed;
};

std::string EncodeCheckpoint(const CollectCheckpoint& c);
absl::StatusOr<CollectCheckpoint> DecodeCheckpoint(const std::string& json,
                                                   const std::string& source);
absl::Status SaveCheckpoint(const std::string& path, const CollectCheckpoint& c);
// NotFound when the file does not exist.
absl::StatusOr<CollectCheckpoint> LoadCheckpoint(const std::string& path);

}  // namespace rl::collector
