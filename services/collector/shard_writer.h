// The collector's writer side: finished samples are buffered and written as numbered shards
// (shard_00000.safetensors, ...; with `jsonl` a JSONL twin beside each), and only once a shard
// is durable are its samples recorded in checkpoint.json (completed, or failed to retry on
// resume): the checkpoint never names a sample that is not on disk. Numbering continues after
// the shards the checkpoint already names.
// Thread safety: none (the writer thread only). Cost: per shard, one encode and two durable
// writes (the shard, then the checkpoint).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "services/collector/checkpoint.h"
#include "services/collector/sample.h"

namespace rl::collector {

class ShardWriter {
 public:
  // `checkpoint` is updated in place and saved to `checkpoint_path` after every shard; it must
  // outlive the writer.
  ShardWriter(std::string dir, std::string checkpoint_path, bool jsonl,
              CollectCheckpoint* checkpoint);

  void Add(SampleRecord record) { buffer_.push_back(std::move(record)); }
  size_t buffered() const { return buffer_.size(); }
  // Writes the buffered samples as the next shard, records them in the checkpoint and saves it.
  // OK with nothing written when the buffer is empty.
  absl::Status Flush();
  int64_t shards_written() const { return shards_written_; }

 private:
  const std::string dir_;
  const std::string checkpoint_path_;
  const bool jsonl_;
  CollectCheckpoint* checkpoint_;
  int64_t next_shard_;
  int64_t shards_written_ = 0;
  std::vector<SampleRecord> buffer_;
};

// Removes the *.tmp files a crash left in `dir` (half-written shards or checkpoints).
void RemoveStaleTemps(const std::string& dir);

}  // namespace rl::collector
