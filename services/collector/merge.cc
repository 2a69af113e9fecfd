#include "services/collector/merge.h"

#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "common/sha256.h"
#include "nlohmann/json.hpp"
#include "services/collector/durable_file.h"
#include "services/collector/shard.h"

namespace rl::collector {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxShardBytes = size_t{16} << 30;

}  // namespace

absl::StatusOr<MergeSummary> MergeShards(const std::string& dir,
                                         const CollectCheckpoint& checkpoint) {
  std::map<SampleKey, SampleRecord> merged;
  for (const std::string& name : checkpoint.shards) {
    const std::string path = (fs::path(dir) / name).string();
    auto bytes = ReadFileBounded(path, kMaxShardBytes);
    if (!bytes.ok()) return bytes.status();
    auto records = DecodeShard(*bytes, path);
    if (!records.ok()) return records.status();
    for (SampleRecord& r : *records) {
      if (!checkpoint.completed.contains(r.key) && !checkpoint.failed.contains(r.key)) continue;
      merged[r.key] = std::move(r);  // later shards hold newer records
    }
  }
  std::vector<SampleRecord> records;
  records.reserve(merged.size());
  MergeSummary summary;
  for (auto& [key, r] : merged) {
    if (!r.ok()) ++summary.num_failed;
    summary.num_tokens += static_cast<int64_t>(r.tokens.size());
    records.push_back(std::move(r));
  }
  summary.num_samples = static_cast<int64_t>(records.size());
  const std::string bytes = EncodeShard(records);
  summary.path = (fs::path(dir) / kMergedName).string();
  if (absl::Status s = WriteFileDurably(summary.path, bytes); !s.ok()) return s;
  nlohmann::json manifest = {
      {"format", "rlfleet.collect.manifest.v1"},
      {"file", kMergedName},
      {"trajectory_format", kShardFormat},
      {"sha256", Sha256Hex(bytes)},
      {"bytes", bytes.size()},
      {"num_samples", summary.num_samples},
      {"num_failed", summary.num_failed},
      {"num_tokens", summary.num_tokens},
      {"n", checkpoint.n},
      {"total", checkpoint.total},
      {"complete", summary.num_samples == checkpoint.total && summary.num_failed == 0},
      {"prompts_sha256", checkpoint.prompts_sha256},
      {"shards", checkpoint.shards}};
  if (absl::Status s =
          WriteFileDurably((fs::path(dir) / kManifestName).string(), manifest.dump(2) + "\n");
      !s.ok()) {
    return s;
  }
  return summary;
}

}  // namespace rl::collector
