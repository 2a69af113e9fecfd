#include "services/collector/checkpoint.h"

#include <cmath>
#include <filesystem>
#include <limits>

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

// NaN (a prompt token's logprob, an unknown one) is null in JSON.
Json Floats(const std::vector<float>& v) {
  Json a = Json::array();
  for (float x : v) a.push_back(std::isnan(x) ? Json(nullptr) : Json(x));
  return a;
}

std::vector<float> FloatsOf(const Json& a) {
  std::vector<float> v;
  for (const Json& x : a) {
    v.push_back(x.is_null() ? std::numeric_limits<float>::quiet_NaN() : x.get<float>());
  }
  return v;
}

Json RecordJson(const SampleRecord& r) {
  return {{"status", r.status},
          {"finish_reason", r.finish_reason},
          {"prompt_len", r.prompt_len},
          {"attempts", r.attempts},
          {"weight_version", r.weight_version},
          {"metadata", r.metadata_json},
          {"group", r.group},
          {"text", r.text},
          {"tokens", r.tokens},
          {"loss_mask", r.loss_mask},
          {"rollout_logprobs", Floats(r.rollout_logprobs)},
          {"weight_versions", r.weight_versions}};
}

Json PartialJson(const PartialSample& p) {
  Json j = {{"index", p.key.index}, {"sample", p.key.sample}};
  if (p.record.has_value()) {
    j["record"] = RecordJson(*p.record);
    return j;
  }
  j["dispatch_version"] = p.dispatch_version;
  j["output_ids"] = p.output_ids;
  j["output_logprobs"] = Floats(p.output_logprobs);
  Json segs = Json::array();
  for (const auto& [version, tokens] : p.segments) segs.push_back({version, tokens});
  j["segments"] = segs;
  return j;
}

// Bounds what a corrupt file can make us allocate per partial sample.
constexpr size_t kMaxPartialTokens = size_t{1} << 22;

absl::StatusOr<PartialSample> PartialOf(const Json& j, const CollectCheckpoint& c) {
  PartialSample p;
  p.key.index = j.at("index").get<int64_t>();
  p.key.sample = j.at("sample").get<int32_t>();
  if (p.key.sample < 0 || p.key.sample >= c.n) {
    return absl::DataLossError("partials holds a bad sample number");
  }
  auto sized = [](const Json& a) { return a.is_array() && a.size() <= kMaxPartialTokens; };
  if (j.contains("record")) {
    const Json& r = j.at("record");
    SampleRecord rec;
    rec.key = p.key;
    for (const char* f : {"tokens", "loss_mask", "rollout_logprobs", "weight_versions"}) {
      if (!sized(r.at(f))) return absl::DataLossError("partials holds an oversized record");
    }
    rec.status = r.at("status").get<std::string>();
    rec.finish_reason = r.at("finish_reason").get<std::string>();
    rec.prompt_len = r.at("prompt_len").get<int32_t>();
    rec.attempts = r.at("attempts").get<int32_t>();
    rec.weight_version = r.at("weight_version").get<int64_t>();
    rec.metadata_json = r.at("metadata").get<std::string>();
    rec.group = r.at("group").get<int64_t>();
    rec.text = r.at("text").get<std::string>();
    rec.tokens = r.at("tokens").get<std::vector<int32_t>>();
    rec.loss_mask = r.at("loss_mask").get<std::vector<uint8_t>>();
    rec.rollout_logprobs = FloatsOf(r.at("rollout_logprobs"));
    rec.weight_versions = r.at("weight_versions").get<std::vector<int64_t>>();
    const size_t n = rec.tokens.size();
    if (rec.loss_mask.size() != n || rec.rollout_logprobs.size() != n ||
        rec.weight_versions.size() != n || rec.prompt_len < 0 ||
        static_cast<size_t>(rec.prompt_len) > n) {
      return absl::DataLossError("partials holds a record whose columns disagree");
    }
    p.record = std::move(rec);
    return p;
  }
  if (!sized(j.at("output_ids")) || !sized(j.at("output_logprobs")) || !sized(j.at("segments"))) {
    return absl::DataLossError("partials holds an oversized sample");
  }
  p.dispatch_version = j.at("dispatch_version").get<int64_t>();
  p.output_ids = j.at("output_ids").get<std::vector<int32_t>>();
  p.output_logprobs = FloatsOf(j.at("output_logprobs"));
  int64_t covered = 0;
  for (const Json& s : j.at("segments")) {
    if (!s.is_array() || s.size() != 2) return absl::DataLossError("partials: bad segment");
    p.segments.emplace_back(s[0].get<int64_t>(), s[1].get<int32_t>());
    if (p.segments.back().second <= 0) return absl::DataLossError("partials: bad segment");
    covered += p.segments.back().second;
  }
  if (p.output_ids.empty() ||
      (!p.output_logprobs.empty() && p.output_logprobs.size() != p.output_ids.size()) ||
      (!p.segments.empty() && covered != static_cast<int64_t>(p.output_ids.size()))) {
    return absl::DataLossError("partials holds a sample whose columns disagree");
  }
  return p;
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
  if (!c.dropped.empty()) j["dropped"] = Keys(c.dropped);
  if (!c.partials.empty()) {
    Json a = Json::array();
    for (const PartialSample& p : c.partials) a.push_back(PartialJson(p));
    j["partials"] = a;
  }
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
    for (const char* name : {"completed", "failed", "dropped"}) {
      auto& set = std::string(name) == "completed" ? c.completed
                  : std::string(name) == "failed"  ? c.failed
                                                   : c.dropped;
      if (!j.contains(name)) continue;  // "dropped" is written only when not empty
      int64_t budget = c.total;         // bounds what a corrupt file can make us allocate
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
    if (j.contains("partials")) {
      const Json& a = j.at("partials");
      if (!a.is_array() || static_cast<int64_t>(a.size()) > c.total) {
        return bad("partials is not an array of at most total samples");
      }
      for (const Json& p : a) {
        absl::StatusOr<PartialSample> ps = PartialOf(p, c);
        if (!ps.ok()) return bad(std::string(ps.status().message()));
        c.partials.push_back(*std::move(ps));
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
