// rlctl's offline commands over the C++ tokenizer and the model maker (no server involved).

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_io/model_maker.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/rlctl/commands.h"

namespace rl::rlctl {
namespace {

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

// The whole file, bounded: tokenize holds it and its encoding in memory.
constexpr std::uintmax_t kMaxFileBytes = 64u << 20;

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("--file: ", path, ": ", ec.message()));
  if (size > kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--file: ", path, " is ", size, " bytes, more than the limit of ", kMaxFileBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--file: cannot open ", path));
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (static_cast<std::uintmax_t>(in.gcount()) != size) {
    return absl::DataLossError(absl::StrCat("--file: short read of ", path));
  }
  return text;
}

}  // namespace

absl::Status Tokenize(const Options& o) {
  if (o.text_set && !o.file.empty()) {
    return absl::InvalidArgumentError("usage: tokenize takes --text or --file, not both");
  }
  ASSIGN_OR_RETURN(auto tok, Load(o));
  const bool add_special = !o.no_special;
  if (o.text_set || !o.file.empty()) {
    std::string text = o.text;
    if (!o.file.empty()) {
      ASSIGN_OR_RETURN(text, ReadTextFile(o.file));
    }
    ASSIGN_OR_RETURN(tokenizer::Encoding enc, tok->Encode(text, add_special));
    Json ids = enc.ids;
    std::cout << (o.json ? Json{{"ids", ids}}.dump() : ids.dump()) << "\n";
    return absl::OkStatus();
  }
  // One text per stdin line (with --jsonl a JSON string, so a text may hold newlines); with
  // --json one object {"ids": [[...], ...]} at the end.
  Json all = Json::array();
  std::string line;
  int line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    std::string text;
    if (o.jsonl) {
      Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line_no, ": --jsonl wants one JSON string per line"));
      }
      text = j.get<std::string>();
    } else {
      text = std::move(line);
    }
    auto enc = tok->Encode(text, add_special);
    if (!enc.ok()) return Annotate(enc.status(), absl::StrCat("line ", line_no));
    if (o.json) {
      all.push_back(enc->ids);
    } else {
      std::cout << Json(enc->ids).dump() << "\n";
    }
  }
  if (o.json) std::cout << Json{{"ids", all}}.dump() << "\n";
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
  // One JSON array per stdin line; with --json one object {"texts": [...]} at the end.
  Json all = Json::array();
  std::string line;
  int line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIdArray(line, line_no));
    auto text = tok->Decode(ids, o.skip_special);
    if (!text.ok()) return Annotate(text.status(), absl::StrCat("line ", line_no));
    if (o.json) {
      all.push_back(*text);
    } else {
      std::cout << *text << "\n";
    }
  }
  if (o.json) std::cout << Json{{"texts", all}}.dump() << "\n";
  return absl::OkStatus();
}

int MakeModel(const Options& o) {
  if (o.arch.empty() || o.size.empty() || o.out.empty()) {
    return Fail(
        o, Usage("make-model --arch llama|qwen2|qwen3|qwen3_moe --size tiny|0.5b|1b|8b --out DIR"));
  }
  model_io::MakeModelOptions m;
  m.arch = o.arch;
  m.size = o.size;
  m.seed = o.seed >= 0 ? static_cast<uint64_t>(o.seed) : 0;
  m.dtype = o.dtype;
  m.out_dir = o.out;
  if (absl::Status s = model_io::MakeModel(m); !s.ok()) return Fail(o, s);
  Json out = {{"out", o.out}, {"arch", o.arch}, {"size", o.size}, {"seed", m.seed}};
  std::cout << (o.json ? out.dump() : "wrote " + o.arch + " " + o.size + " model to " + o.out)
            << "\n";
  return 0;
}

}  // namespace rl::rlctl
