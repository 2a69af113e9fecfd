#include "services/admin/rlctl_offline.h"

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace rl::rlctl {
namespace {

using Json = nlohmann::json;

absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> Load(const Options& o) {
  if (o.tokenizer.empty()) {
    return absl::InvalidArgumentError("usage: --tokenizer DIR (a folder with tokenizer.json)");
  }
  return tokenizer::Tokenizer::FromDir(o.tokenizer);
}

// Parses one JSON array of ids.
absl::StatusOr<std::vector<int32_t>> ParseIdArray(const std::string& line, int line_no) {
  Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  const std::string where = absl::StrCat("line ", line_no, ": ");
  if (!j.is_array()) return absl::InvalidArgumentError(where + "expected a JSON array of ids");
  std::vector<int32_t> ids;
  for (const Json& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(where + "ids must be non-negative integers");
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

}  // namespace

absl::Status Tokenize(const Options& o) {
  ASSIGN_OR_RETURN(auto tok, Load(o));
  const bool add_special = !o.no_special;
  if (!o.text.empty()) {
    ASSIGN_OR_RETURN(tokenizer::Encoding enc, tok->Encode(o.text, add_special));
    Json ids = enc.ids;
    std::cout << (o.json ? Json{{"ids", ids}}.dump() : ids.dump()) << "\n";
    return absl::OkStatus();
  }
  std::string line;
  int line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    auto enc = tok->Encode(line, add_special);
    if (!enc.ok()) return Annotate(enc.status(), absl::StrCat("line ", line_no));
    std::cout << Json(enc->ids).dump() << "\n";
  }
  return absl::OkStatus();
}

absl::Status Detokenize(const Options& o) {
  ASSIGN_OR_RETURN(auto tok, Load(o));
  if (!o.ids.empty()) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIdArray("[" + o.ids + "]", 1));
    ASSIGN_OR_RETURN(std::string text, tok->Decode(ids, o.skip_special));
    std::cout << (o.json ? Json{{"text", text}}.dump() : text) << "\n";
    return absl::OkStatus();
  }
  std::string line;
  int line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIdArray(line, line_no));
    auto text = tok->Decode(ids, o.skip_special);
    if (!text.ok()) return Annotate(text.status(), absl::StrCat("line ", line_no));
    std::cout << (o.json ? Json(*text).dump() : *text) << "\n";
  }
  return absl::OkStatus();
}

}  // namespace rl::rlctl
