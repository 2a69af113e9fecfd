#include "services/collector/prompt_set.h"

#include <fstream>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "nlohmann/json.hpp"

namespace rl::collector {
namespace {

using Json = nlohmann::json;

absl::Status RowError(size_t line_no, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("prompt line ", line_no, ": ", what));
}

bool IsInt(const Json& j) { return j.is_number_integer() || j.is_number_unsigned(); }

absl::Status Apply(const Json& s, rl::v1::SamplingParams* p) {
  if (!s.is_object()) return absl::InvalidArgumentError("sampling_params is not an object");
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    const Json& v = it.value();
    auto need_int = [&](int64_t lo, int64_t hi) -> absl::StatusOr<int64_t> {
      if (!IsInt(v))
        return absl::InvalidArgumentError(
            absl::StrCat("sampling_params.", k, " is not an integer"));
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
        return absl::InvalidArgumentError(absl::StrCat("sampling_params.", k, " is out of range"));
      }
      int64_t x = v.get<int64_t>();
      if (x < lo || x > hi) {
        return absl::InvalidArgumentError(
            absl::StrCat("sampling_params.", k, " is out of range [", lo, ", ", hi, "]"));
      }
      return x;
    };
    auto need_float = [&]() -> absl::StatusOr<float> {
      if (!v.is_number())
        return absl::InvalidArgumentError(absl::StrCat("sampling_params.", k, " is not a number"));
      return v.get<float>();
    };
    const int32_t kI32 = std::numeric_limits<int32_t>::max();
    if (k == "max_new_tokens") {
      auto x = need_int(0, kI32);
      if (!x.ok()) return x.status();
      p->set_max_new_tokens(static_cast<int32_t>(*x));
    } else if (k == "min_new_tokens") {
      auto x = need_int(0, kI32);
      if (!x.ok()) return x.status();
      p->set_min_new_tokens(static_cast<int32_t>(*x));
    } else if (k == "top_k") {
      auto x = need_int(-1, kI32);
      if (!x.ok()) return x.status();
      p->set_top_k(static_cast<int32_t>(*x));
    } else if (k == "seed") {
      auto x = need_int(0, std::numeric_limits<int64_t>::max());
      if (!x.ok()) return x.status();
      p->set_seed(static_cast<uint64_t>(*x));
    } else if (k == "temperature" || k == "top_p" || k == "min_p" || k == "repetition_penalty" ||
               k == "frequency_penalty" || k == "presence_penalty") {
      auto x = need_float();
      if (!x.ok()) return x.status();
      if (k == "temperature") p->set_temperature(*x);
      if (k == "top_p") p->set_top_p(*x);
      if (k == "min_p") p->set_min_p(*x);
      if (k == "repetition_penalty") p->set_repetition_penalty(*x);
      if (k == "frequency_penalty") p->set_frequency_penalty(*x);
      if (k == "presence_penalty") p->set_presence_penalty(*x);
    } else if (k == "ignore_eos") {
      if (!v.is_boolean())
        return absl::InvalidArgumentError("sampling_params.ignore_eos is not a boolean");
      p->set_ignore_eos(v.get<bool>());
    } else if (k == "stop") {
      if (!v.is_array())
        return absl::InvalidArgumentError("sampling_params.stop is not an array of strings");
      p->clear_stop();
      for (const Json& e : v) {
        if (!e.is_string())
          return absl::InvalidArgumentError("sampling_params.stop is not an array of strings");
        p->add_stop(e.get<std::string>());
      }
    } else if (k == "stop_token_ids") {
      if (!v.is_array())
        return absl::InvalidArgumentError(
            "sampling_params.stop_token_ids is not an array of integers");
      p->clear_stop_token_ids();
      for (const Json& e : v) {
        if (!IsInt(e) || e.get<int64_t>() < 0 || e.get<int64_t>() > kI32) {
          return absl::InvalidArgumentError(
              "sampling_params.stop_token_ids is not an array of token ids");
        }
        p->add_stop_token_ids(e.get<int32_t>());
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown field sampling_params.", k));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PromptRow> ParsePromptRow(const std::string& line, size_t line_no) {
  Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return RowError(line_no, "not valid JSON");
  if (!j.is_object()) return RowError(line_no, "not a JSON object");
  PromptRow row;
  if (!j.contains("index")) return RowError(line_no, "missing required field `index`");
  const Json& idx = j["index"];
  if (!IsInt(idx) || (idx.is_number_unsigned() &&
                      idx.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))) {
    return RowError(line_no, "`index` is not a 64-bit integer");
  }
  row.index = idx.get<int64_t>();
  const bool has_text = j.contains("text"), has_ids = j.contains("input_ids");
  if (has_text == has_ids) return RowError(line_no, "needs exactly one of `text` or `input_ids`");
  if (has_text) {
    if (!j["text"].is_string()) return RowError(line_no, "`text` is not a string");
    row.has_text = true;
    row.text = j["text"].get<std::string>();
    if (row.text.empty()) return RowError(line_no, "`text` is empty");
  } else {
    const Json& ids = j["input_ids"];
    if (!ids.is_array() || ids.empty())
      return RowError(line_no, "`input_ids` is not a non-empty array");
    if (ids.size() > kMaxPromptIds) {
      return RowError(line_no, absl::StrCat("`input_ids` has more than ", kMaxPromptIds, " ids"));
    }
    row.input_ids.reserve(ids.size());
    for (const Json& e : ids) {
      if (!IsInt(e) || e.get<int64_t>() < 0 ||
          e.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return RowError(line_no, "`input_ids` holds a value that is not a token id");
      }
      row.input_ids.push_back(e.get<int32_t>());
    }
  }
  if (j.contains("sampling_params")) {
    rl::v1::SamplingParams scratch;
    if (absl::Status s = Apply(j["sampling_params"], &scratch); !s.ok()) {
      return RowError(line_no, std::string(s.message()));
    }
    row.sampling_json = j["sampling_params"].dump();
  }
  if (j.contains("routing_key")) {
    // Issue 32: the row's own routing key (else rl-collect keys on the row's group); also
    // kept as metadata.
    if (!j["routing_key"].is_string() || j["routing_key"].get<std::string>().size() > 256) {
      return RowError(line_no, "`routing_key` is not a string of at most 256 bytes");
    }
    row.routing_key = j["routing_key"].get<std::string>();
  }
  Json meta = Json::object();
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "index" || it.key() == "text" || it.key() == "input_ids" ||
        it.key() == "sampling_params") {
      continue;
    }
    meta[it.key()] = it.value();
  }
  row.metadata_json = meta.dump(-1, ' ', false, Json::error_handler_t::replace);
  return row;
}

absl::StatusOr<PromptSet> LoadPromptSet(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open the prompt set ", path));
  PromptSet set;
  Sha256 hash;
  absl::flat_hash_map<int64_t, size_t> seen;  // index -> line
  std::string line;
  size_t line_no = 0;
  while (true) {
    line.clear();
    // Bounded getline: never buffers more than kMaxLineBytes + 1.
    char c;
    bool any = false;
    while (in.get(c)) {
      any = true;
      if (c == '\n') break;
      if (line.size() > kMaxLineBytes) {
        return RowError(line_no + 1, absl::StrCat("longer than ", kMaxLineBytes, " bytes"));
      }
      line.push_back(c);
    }
    if (!any) break;
    ++line_no;
    hash.Update(line);
    hash.Update("\n");
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (set.rows.size() >= kMaxRows) {
      return RowError(line_no, absl::StrCat("the prompt set has more than ", kMaxRows, " rows"));
    }
    auto row = ParsePromptRow(line, line_no);
    if (!row.ok()) return row.status();
    auto [it, inserted] = seen.emplace(row->index, line_no);
    if (!inserted) {
      return RowError(line_no, absl::StrCat("duplicate index ", row->index, " (first on line ",
                                            it->second, ")"));
    }
    row->group = static_cast<int64_t>(set.rows.size());
    set.rows.push_back(std::move(*row));
  }
  if (set.rows.empty())
    return absl::InvalidArgumentError(absl::StrCat(path, " has no prompt rows"));
  set.sha256 = ToHex(hash.Final());
  return set;
}

absl::Status ApplySamplingOverrides(const std::string& sampling_json,
                                    rl::v1::SamplingParams* params) {
  if (sampling_json.empty()) return absl::OkStatus();
  Json j = Json::parse(sampling_json, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError("sampling_params is not valid JSON");
  return Apply(j, params);
}

}  // namespace rl::collector
