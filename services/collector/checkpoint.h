// checkpoint.json: the collector's durable progress in its output folder.
//
// {"format": "rlfleet.collect.checkpoint.v1", "prompts_sha256": ..., "n": N, "total": rows*N,
//  "shards": ["shard_00000.safetensors", ...],
//  "completed": [[first_index, last_index, sample], ...],  // saved with status "ok"
//  "failed": [[first_index, last_index, sample], ...]}     // saved with an error status
// (runs of consecutive indices with one sample number; failed samples are retried on resume).
// Over-sampling runs (--batch-groups, issue 34) add
//   "dropped": [[first_index, last_index, 0], ...]  // groups the --group-filter dropped
//   "partials": [{"index", "sample", "dispatch_version", "output_ids", "output_logprobs",
//                 "segments": [[version, tokens], ...]} | {"index", "sample", "record": {...}}]
// the samples of groups aborted once the batch was complete: an aborted sample's earlier
// output (resumed within its budget by the next run, ResumeFrom by tokens), or a finished
// sample of an unfinished group (its whole record, so the group is written whole). Logprobs
// that are NaN are written null.
// Written with WriteFileDurably after every shard, so it only ever names shards that are
// already on disk; a crash loses at most the samples not yet in a shard.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/collector/sample.h"
#include "services/collector/sample_set.h"

namespace rl::collector {

// A sample of a group aborted after its batch was complete (see the header comment).
struct PartialSample {
  SampleKey key;
  int64_t dispatch_version = 0;
  std::vector<int32_t> output_ids;
  std::vector<float> output_logprobs;                 // empty or one per output id
  std::vector<std::pair<int64_t, int32_t>> segments;  // (weight version, tokens)
  std::optional<SampleRecord> record;                 // a finished sample: kept whole, not resumed
};

struct CollectCheckpoint {
  std::string prompts_sha256;
  int32_t n = 1;
  int64_t total = 0;
  std::vector<std::string> shards;
  SampleSet completed;
  SampleSet failed;
  SampleSet dropped;  // (index, 0) per dropped group
  std::vector<PartialSample> partials;
};

std::string EncodeCheckpoint(const CollectCheckpoint& c);
absl::StatusOr<CollectCheckpoint> DecodeCheckpoint(const std::string& json,
                                                   const std::string& source);
absl::Status SaveCheckpoint(const std::string& path, const CollectCheckpoint& c);
// NotFound when the file does not exist.
absl::StatusOr<CollectCheckpoint> LoadCheckpoint(const std::string& path);

}  // namespace rl::collector
