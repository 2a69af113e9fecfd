#include "services/collector/shard_writer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "common/status.h"
#include "services/collector/durable_file.h"
#include "services/collector/shard.h"
#include "spdlog/spdlog.h"

namespace rl::collector {
namespace {

namespace fs = std::filesystem;

std::string ShardName(int64_t number) { return absl::StrFormat("shard_%05d.safetensors", number); }

int64_t NextShardNumber(const CollectCheckpoint& c) {
  int64_t next = 0;
  for (const std::string& s : c.shards) {
    int64_t v = 0;
    if (std::sscanf(s.c_str(), "shard_%ld.safetensors", &v) == 1) next = std::max(next, v + 1);
  }
  return next;
}

}  // namespace

ShardWriter::ShardWriter(std::string dir, std::string checkpoint_path, bool jsonl,
                         CollectCheckpoint* checkpoint)
    : dir_(std::move(dir)),
      checkpoint_path_(std::move(checkpoint_path)),
      jsonl_(jsonl),
      checkpoint_(checkpoint),
      next_shard_(NextShardNumber(*checkpoint)) {}

absl::Status ShardWriter::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  const std::string name = ShardName(next_shard_);
  const std::string path = (fs::path(dir_) / name).string();
  RETURN_IF_ERROR(WriteFileDurably(path, EncodeShard(buffer_)));
  if (jsonl_) {
    RETURN_IF_ERROR(WriteFileDurably(
        (fs::path(dir_) / absl::StrFormat("shard_%05d.jsonl", next_shard_)).string(),
        EncodeJsonl(buffer_)));
  }
  checkpoint_->shards.push_back(name);
  for (const SampleRecord& r : buffer_) {
    if (r.ok()) {
      checkpoint_->completed.insert(r.key);
      checkpoint_->failed.erase(r.key);
    } else {
      checkpoint_->failed.insert(r.key);
    }
  }
  RETURN_IF_ERROR(SaveCheckpoint(checkpoint_path_, *checkpoint_));
  ++next_shard_;
  ++shards_written_;
  spdlog::debug("rl-collect: wrote {} ({} samples)", name, buffer_.size());
  buffer_.clear();
  return absl::OkStatus();
}

void RemoveStaleTemps(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".tmp") fs::remove(e.path(), ec);
  }
}

}  // namespace rl::collector
