#include "services/collector/checkpoint.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/collector/durable_file.h"
#include "services/collector/prompt_set.h"

namespace rl::collector {
namespace {

using Json = nlohmann::json;
constexpr char kFormat[] = "rlfleet.collect.checkpoint.v1";
constexpr size_t kMaxCheckpointBytes = size_t{4} << 30;

// [[first_index, last_index, sample], ...]: runs of consecutive indices with one sample number,
// so a checkpoint stays small however many samples are done.
Json Keys(const SampleSet& keys) {
  Json a = Json::array();
  keys.ForEachRun([&](int64_t first, int64_t last, int32_t sample) {
    a.push_back({first, last, sample});
  });
  return a;
}

}  // namespace

std::string EncodeCheckpoint(const CollectCheckpoint& c) {
  Json j = {{"format", kFormat},
            {"prompts_sha256", c.prompts_sha256},
            {"n", c.n},
            {"total", c.total},
            {"shards", c.shards},
            {"completed", Keys(c.completed)},
            {"failed", Keys(c.failed)}};
  return j.dump() + "\n";
}

absl::StatusOr<CollectCheckpoint> DecodeCheckpoint(const std::string& json,
                                                   const std::string& source) {
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat(source, ": ", what));
  };
  Json j = Json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (j.value("format", "") != kFormat) return bad(absl::StrCat("format is not ", kFormat));
  CollectCheckpoint c;
  try {
    c.prompts_sha256 = j.at("prompts_sha256").get<std::string>();
    c.n = j.at("n").get<int32_t>();
    c.total = j.at("total").get<int64_t>();
    c.shards = j.at("shards").get<std::vector<std::string>>();
    // n and total bound everything below (the per-set budget); a corrupt total is refused here,
    // before it can size an allocation.
    if (c.n < 1 || c.n > kMaxSamplesPerPrompt) return bad("n is out of range");
    if (c.total < 0 || c.total > static_cast<int64_t>(kMaxRows) * c.n || c.total > kMaxSamples) {
      return bad("total is out of range");
    }
    for (const char* name : {"completed", "failed"}) {
      auto& set = std::string(name) == "completed" ? c.completed : c.failed;
      int64_t budget = c.total;  // bounds what a corrupt file can make us allocate
      for (const Json& k : j.at(name)) {
        if (!k.is_array() || k.size() != 3) {
          return bad(absl::StrCat(name, " holds an entry that is not [first, last, sample]"));
        }
        const int64_t first = k[0].get<int64_t>(), last = k[1].get<int64_t>();
        const int32_t sample = k[2].get<int32_t>();
        if (sample < 0 || sample >= c.n)
          return bad(absl::StrCat(name, " holds a bad sample number"));
        // Unsigned difference: last - first cannot overflow once last >= first.
        if (last < first || static_cast<uint64_t>(last) - static_cast<uint64_t>(first) >=
                                static_cast<uint64_t>(budget)) {
          return bad(absl::StrCat(name, " covers more samples than the total ", c.total));
        }
        budget -= last - first + 1;
        set.InsertRun(first, last, sample);
      }
    }
  } catch (const Json::exception& e) {
    return bad(e.what());
  }
  for (const std::string& s : c.shards) {
    if (s.empty() || s.find('/') != std::string::npos || s.find("..") != std::string::npos) {
      return bad(absl::StrCat("bad shard name '", s, "'"));
    }
  }
  return c;
}

absl::Status SaveCheckpoint(const std::string& path, const CollectCheckpoint& c) {
  return WriteFileDurably(path, EncodeCheckpoint(c));
}

absl::StatusOr<CollectCheckpoint> LoadCheckpoint(const std::string& path) {
  if (!std::filesystem::exists(path)) return absl::NotFoundError(path);
  auto bytes = ReadFileBounded(path, kMaxCheckpointBytes);
  if (!bytes.ok()) return bytes.status();
  return DecodeCheckpoint(*bytes, path);
}

}  // namespace rl::collector
