#include "services/collector/shard.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/model_io/dtype.h"
#include "common/model_io/safetensors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace rl::collector {
namespace {

using Json = nlohmann::json;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

struct Column {
  const char* name;
  const char* dtype;
  size_t elem;
};

// Data order: 8-byte columns first so every tensor is naturally aligned.
constexpr Column kColumns[] = {{"offsets", "I64", 8},
                               {"weight_versions", "I64", 8},
                               {"tokens", "I32", 4},
                               {"rollout_logprobs", "F32", 4},
                               {"loss_mask", "U8", 1}};

// R3 tensors, present only when some sample has routing: routed_offsets I64 [N+1] (element
// offsets into routed_experts), routed_experts I32 [R], expert_weights F32 [R] (NaN for a sample
// without weights) or [0] when no sample has weights.
struct RoutedColumns {
  std::vector<int64_t> offsets{0};
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

absl::Status Bad(const std::string& source, const std::string& what) {
  return absl::DataLossError(absl::StrCat(source, ": ", what));
}

// The optional R3 tensors and metadata of a shard into `records` (already decoded).
absl::Status DecodeRouting(const std::vector<model_io::TensorView>& views, const Json& meta,
                           const std::string& source, std::vector<SampleRecord>* records) {
  const model_io::TensorView *off = nullptr, *ids = nullptr, *weights = nullptr;
  for (const model_io::TensorView& v : views) {
    if (v.name == "routed_offsets") off = &v;
    if (v.name == "routed_experts") ids = &v;
    if (v.name == "expert_weights") weights = &v;
  }
  if (off == nullptr && ids == nullptr) return absl::OkStatus();
  if (off == nullptr || ids == nullptr || weights == nullptr ||
      off->dtype != model_io::DType::kI64 || ids->dtype != model_io::DType::kI32 ||
      weights->dtype != model_io::DType::kF32) {
    return Bad(source, "routed_offsets / routed_experts / expert_weights incomplete or mistyped");
  }
  const size_t num = records->size();
  const int64_t total = ids->NumElements();
  if (off->NumElements() != static_cast<int64_t>(num) + 1 ||
      (weights->NumElements() != 0 && weights->NumElements() != total)) {
    return Bad(source, "routed tensors do not match the samples");
  }
  Json starts, shapes;
  for (auto [name, out] : {std::pair{"routed_start", &starts}, {"routed_shape", &shapes}}) {
    if (!meta.contains(name) || !meta[name].is_string()) {
      return Bad(source, absl::StrCat("no metadata column ", name));
    }
    *out = Json::parse(meta[name].get<std::string>(), nullptr, false);
    if (out->is_discarded() || !out->is_array() || out->size() != num) {
      return Bad(source, absl::StrCat("metadata column ", name, " is not one entry per sample"));
    }
  }
  int64_t prev = 0;
  std::memcpy(&prev, off->data.data(), 8);
  if (prev != 0) return Bad(source, "routed_offsets[0] is not 0");
  try {
    for (size_t i = 0; i < num; ++i) {
      int64_t end = 0;
      std::memcpy(&end, off->data.data() + (i + 1) * 8, 8);
      if (end < prev || end > total) return Bad(source, "routed_offsets out of order");
      SampleRecord& r = (*records)[i];
      r.routed_start = starts[i].get<int32_t>();
      r.routed_shape = shapes[i].get<std::vector<int32_t>>();
      // Empty: no routing; else [tokens, layers, top_k], element count overflow-checked.
      const std::vector<int64_t> dims(r.routed_shape.begin(), r.routed_shape.end());
      const absl::StatusOr<int64_t> n =
          dims.empty() ? absl::StatusOr<int64_t>(0) : model_io::CheckedNumElements(dims);
      if ((!dims.empty() && dims.size() != 3) || !n.ok() || *n != end - prev) {
        return Bad(source, absl::StrCat("sample ", i, ": routed_shape does not match its ",
                                        end - prev, " routed experts"));
      }
      const size_t len = static_cast<size_t>(end - prev);
      r.routed_experts.resize(len);
      std::memcpy(r.routed_experts.data(), ids->data.data() + prev * 4, len * 4);
      r.expert_weights.clear();
      if (weights->NumElements() != 0) {
        r.expert_weights.resize(len);
        std::memcpy(r.expert_weights.data(), weights->data.data() + prev * 4, len * 4);
      }
      prev = end;
    }
  } catch (const Json::exception& e) {
    return Bad(source, absl::StrCat("bad routed metadata: ", e.what()));
  }
  if (prev != total) return Bad(source, "routed_offsets[N] is not the routed count");
  return absl::OkStatus();
}

}  // namespace

std::string EncodeShard(const std::vector<SampleRecord>& records) {
  std::vector<int64_t> offsets{0};
  std::vector<int64_t> versions;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<uint8_t> mask;
  Json index = Json::array(), sample = Json::array(), group = Json::array(), status = Json::array(),
       finish = Json::array(), prompt_len = Json::array(), attempts = Json::array(),
       version = Json::array(), metadata = Json::array();
  for (const SampleRecord& r : records) {
    tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
    mask.insert(mask.end(), r.loss_mask.begin(), r.loss_mask.end());
    logprobs.insert(logprobs.end(), r.rollout_logprobs.begin(), r.rollout_logprobs.end());
    versions.insert(versions.end(), r.weight_versions.begin(), r.weight_versions.end());
    offsets.push_back(static_cast<int64_t>(tokens.size()));
    index.push_back(r.key.index);
    sample.push_back(r.key.sample);
    group.push_back(r.group);
    status.push_back(r.status);
    finish.push_back(r.finish_reason);
    prompt_len.push_back(r.prompt_len);
    attempts.push_back(r.attempts);
    version.push_back(r.weight_version);
    Json m = Json::parse(r.metadata_json, nullptr, /*allow_exceptions=*/false);
    metadata.push_back(m.is_discarded() ? Json::object() : m);
  }
  const int64_t t = static_cast<int64_t>(tokens.size());
  // Columns in data order: 8-byte first, then 4-byte, then 1-byte, so every tensor is naturally
  // aligned (the R3 ones only when a sample has routing).
  bool routed = false, weighted = false;
  for (const SampleRecord& r : records) {
    routed = routed || !r.routed_shape.empty();
    weighted = weighted || !r.expert_weights.empty();
  }
  RoutedColumns rc;
  Json routed_start = Json::array(), routed_shape = Json::array();
  for (const SampleRecord& r : records) {
    if (!routed) break;
    rc.ids.insert(rc.ids.end(), r.routed_experts.begin(), r.routed_experts.end());
    if (weighted) {
      if (r.expert_weights.size() == r.routed_experts.size()) {
        rc.weights.insert(rc.weights.end(), r.expert_weights.begin(), r.expert_weights.end());
      } else {
        rc.weights.resize(rc.ids.size(), std::numeric_limits<float>::quiet_NaN());
      }
    }
    rc.offsets.push_back(static_cast<int64_t>(rc.ids.size()));
    routed_start.push_back(r.routed_start);
    routed_shape.push_back(r.routed_shape);
  }
  struct Out {
    const char* name;
    const char* dtype;
    int64_t count;
    size_t elem;
    const void* data;
  };
  std::vector<Out> cols = {
      {"offsets", "I64", static_cast<int64_t>(offsets.size()), 8, offsets.data()},
      {"weight_versions", "I64", t, 8, versions.data()}};
  if (routed) {
    cols.push_back(
        {"routed_offsets", "I64", static_cast<int64_t>(rc.offsets.size()), 8, rc.offsets.data()});
  }
  cols.push_back({"tokens", "I32", t, 4, tokens.data()});
  cols.push_back({"rollout_logprobs", "F32", t, 4, logprobs.data()});
  if (routed) {
    cols.push_back(
        {"routed_experts", "I32", static_cast<int64_t>(rc.ids.size()), 4, rc.ids.data()});
    cols.push_back(
        {"expert_weights", "F32", static_cast<int64_t>(rc.weights.size()), 4, rc.weights.data()});
  }
  cols.push_back({"loss_mask", "U8", t, 1, mask.data()});
  Json header = Json::object();
  int64_t begin = 0;
  for (const Out& c : cols) {
    const int64_t end = begin + c.count * static_cast<int64_t>(c.elem);
    header[c.name] = {{"dtype", c.dtype}, {"shape", {c.count}}, {"data_offsets", {begin, end}}};
    begin = end;
  }
  header["__metadata__"] = {
      {"format", kShardFormat},        {"num_samples", std::to_string(records.size())},
      {"index", Dump(index)},          {"sample", Dump(sample)},
      {"group", Dump(group)},          {"status", Dump(status)},
      {"finish_reason", Dump(finish)}, {"prompt_len", Dump(prompt_len)},
      {"attempts", Dump(attempts)},    {"weight_version", Dump(version)},
      {"metadata", Dump(metadata)}};
  if (routed) {
    header["__metadata__"]["routed_start"] = Dump(routed_start);
    header["__metadata__"]["routed_shape"] = Dump(routed_shape);
  }
  std::string head = Dump(header);
  while (head.size() % 8 != 0) head.push_back(' ');
  std::string out(8, '\0');
  const uint64_t n = head.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += head;
  for (const Out& c : cols) {
    out.append(static_cast<const char*>(c.data), static_cast<size_t>(c.count) * c.elem);
  }
  return out;
}

absl::StatusOr<std::vector<SampleRecord>> DecodeShard(const std::string& bytes,
                                                      const std::string& source) {
  auto views = model_io::ParseSafetensors(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
      source);
  if (!views.ok()) return views.status();
  const model_io::TensorView* by_name[std::size(kColumns)] = {};
  for (const model_io::TensorView& v : *views) {
    for (size_t i = 0; i < std::size(kColumns); ++i) {
      if (v.name == kColumns[i].name) by_name[i] = &v;
    }
  }
  for (size_t i = 0; i < std::size(kColumns); ++i) {
    if (by_name[i] == nullptr) return Bad(source, absl::StrCat("no tensor ", kColumns[i].name));
    if (std::string(model_io::DTypeName(by_name[i]->dtype)) != kColumns[i].dtype ||
        by_name[i]->shape.size() != 1) {
      return Bad(source,
                 absl::StrCat("tensor ", kColumns[i].name, " is not a 1-D ", kColumns[i].dtype));
    }
  }
  // Header metadata (ParseSafetensors validated the framing).
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  Json header = Json::parse(bytes.substr(8, n), nullptr, false);
  if (header.is_discarded() || !header.contains("__metadata__")) {
    return Bad(source, "no __metadata__ in the header");
  }
  const Json& meta = header["__metadata__"];
  if (!meta.contains("format") || meta["format"] != kShardFormat) {
    return Bad(source, absl::StrCat("not a ", kShardFormat, " file"));
  }
  auto column = [&](const char* name, Json* out) -> absl::Status {
    if (!meta.contains(name) || !meta[name].is_string()) {
      return Bad(source, absl::StrCat("no metadata column ", name));
    }
    *out = Json::parse(meta[name].get<std::string>(), nullptr, false);
    if (out->is_discarded() || !out->is_array()) {
      return Bad(source, absl::StrCat("metadata column ", name, " is not a JSON array"));
    }
    return absl::OkStatus();
  };
  Json index, sample, group, status, finish, prompt_len, attempts, version, metadata;
  for (auto [name, out] : {std::pair{"index", &index},
                           {"sample", &sample},
                           {"group", &group},
                           {"status", &status},
                           {"finish_reason", &finish},
                           {"prompt_len", &prompt_len},
                           {"attempts", &attempts},
                           {"weight_version", &version},
                           {"metadata", &metadata}}) {
    if (absl::Status s = column(name, out); !s.ok()) return s;
  }
  const size_t num = index.size();
  for (const Json* c :
       {&sample, &group, &status, &finish, &prompt_len, &attempts, &version, &metadata}) {
    if (c->size() != num) return Bad(source, "metadata columns differ in length");
  }
  const model_io::TensorView& off_v = *by_name[0];
  if (off_v.NumElements() != static_cast<int64_t>(num) + 1) {
    return Bad(source, "offsets must have num_samples + 1 entries");
  }
  const int64_t total = by_name[2]->NumElements();
  for (size_t i = 1; i < std::size(kColumns); ++i) {
    if (by_name[i]->NumElements() != total) return Bad(source, "token columns differ in length");
  }
  auto at = [](const model_io::TensorView& v, auto* out, int64_t i) {
    std::memcpy(out, v.data.data() + i * static_cast<int64_t>(sizeof(*out)), sizeof(*out));
  };
  std::vector<SampleRecord> records(num);
  int64_t prev = 0;
  at(off_v, &prev, 0);
  if (prev != 0) return Bad(source, "offsets[0] is not 0");
  try {
    for (size_t i = 0; i < num; ++i) {
      int64_t end = 0;
      at(off_v, &end, static_cast<int64_t>(i) + 1);
      if (end < prev || end > total) return Bad(source, "offsets are not non-decreasing within T");
      SampleRecord& r = records[i];
      r.key.index = index[i].get<int64_t>();
      r.key.sample = sample[i].get<int32_t>();
      r.group = group[i].get<int64_t>();
      r.status = status[i].get<std::string>();
      r.finish_reason = finish[i].get<std::string>();
      r.prompt_len = prompt_len[i].get<int32_t>();
      r.attempts = attempts[i].get<int32_t>();
      r.weight_version = version[i].get<int64_t>();
      r.metadata_json = Dump(metadata[i]);
      const size_t len = static_cast<size_t>(end - prev);
      r.weight_versions.resize(len);
      r.tokens.resize(len);
      r.rollout_logprobs.resize(len);
      r.loss_mask.resize(len);
      std::memcpy(r.weight_versions.data(), by_name[1]->data.data() + prev * 8, len * 8);
      std::memcpy(r.tokens.data(), by_name[2]->data.data() + prev * 4, len * 4);
      std::memcpy(r.rollout_logprobs.data(), by_name[3]->data.data() + prev * 4, len * 4);
      std::memcpy(r.loss_mask.data(), by_name[4]->data.data() + prev, len);
      if (r.prompt_len < 0 || static_cast<size_t>(r.prompt_len) > len) {
        return Bad(source, absl::StrCat("sample ", i, " has prompt_len beyond its tokens"));
      }
      prev = end;
    }
  } catch (const Json::exception& e) {
    return Bad(source, absl::StrCat("bad metadata value: ", e.what()));
  }
  if (prev != total) return Bad(source, "offsets[N] is not the token count");
  RETURN_IF_ERROR(DecodeRouting(*views, meta, source, &records));
  return records;
}

std::string EncodeJsonl(const std::vector<SampleRecord>& records) {
  std::string out;
  for (const SampleRecord& r : records) {
    Json logprobs = Json::array();
    for (float f : r.rollout_logprobs) logprobs.push_back(std::isnan(f) ? Json() : Json(f));
    Json m = Json::parse(r.metadata_json, nullptr, false);
    Json j = {{"index", r.key.index},
              {"sample", r.key.sample},
              {"group", r.group},
              {"status", r.status},
              {"finish_reason", r.finish_reason},
              {"prompt_len", r.prompt_len},
              {"attempts", r.attempts},
              {"weight_version", r.weight_version},
              {"metadata", m.is_discarded() ? Json::object() : m},
              {"text", r.text},
              {"tokens", r.tokens},
              {"loss_mask", r.loss_mask},
              {"rollout_logprobs", logprobs},
              {"weight_versions", r.weight_versions}};
    if (!r.routed_shape.empty()) {
      Json w = Json::array();
      for (float f : r.expert_weights) w.push_back(std::isnan(f) ? Json() : Json(f));
      j["routed_start"] = r.routed_start;
      j["routed_shape"] = r.routed_shape;
      j["routed_experts"] = r.routed_experts;
      j["expert_weights"] = w;
    }
    out += Dump(j);
    out += '\n';
  }
  return out;
}

}  // namespace rl::collector
