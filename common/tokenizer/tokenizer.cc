#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/fork_join_pool.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/normalized_string.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/post_processor.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/unicode.h"

namespace rl::tokenizer {

using json_util::Json;

namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return ss.str();
}

absl::StatusOr<Json> ParseJson(std::string_view text, const std::string& what) {
  Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
  }
  return json;
}

absl::StatusOr<std::vector<AddedToken>> ParseAddedTokens(const Json& root) {
  std::vector<AddedToken> tokens;
  const Json* list = json_util::Find(root, "added_tokens");
  if (list == nullptr) return tokens;
  if (!list->is_array()) return json_util::TypeError("added_tokens", "an array", *list);
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& t = (*list)[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object()) return json_util::TypeError(where, "an object", t);
    AddedToken token;
    ASSIGN_OR_RETURN(const int64_t id, json_util::GetIntOr(t, "id", where, -1));
    if (id < 0 || id >= (1 << 26)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", where, ".id must be a non-negative integer"));
    }
    token.id = static_cast<int32_t>(id);
    ASSIGN_OR_RETURN(token.content, json_util::GetString(t, "content", where));
    ASSIGN_OR_RETURN(token.special, json_util::GetBoolOr(t, "special", where, false));
    ASSIGN_OR_RETURN(token.lstrip, json_util::GetBoolOr(t, "lstrip", where, false));
    ASSIGN_OR_RETURN(token.rstrip, json_util::GetBoolOr(t, "rstrip", where, false));
    ASSIGN_OR_RETURN(token.single_word, json_util::GetBoolOr(t, "single_word", where, false));
    ASSIGN_OR_RETURN(token.normalized,
                     json_util::GetBoolOr(t, "normalized", where, !token.special));
    if (FindInvalidUtf8(token.content) != std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", where, ".content is not valid UTF-8"));
    }
    tokens.push_back(std::move(token));
  }
  return tokens;
}

// A token named in tokenizer_config.json: "text" or {"content": "text", ...}.
std::optional<std::string> ConfigToken(const Json& config, const std::string& key) {
  const Json* v = json_util::Find(config, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (const Json* c = json_util::Find(*v, "content"); c != nullptr && c->is_string()) {
    return c->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  auto tok = FromJson(text);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), absl::StrCat(path, ": ", tok.status().message()));
  }
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json_text) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  absl::Status status;
  try {
    status = tok->Load(json_text);
  } catch (const std::exception& e) {
    // The accessors check types first; this only guards against a missed case.
    status = absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  }
  RETURN_IF_ERROR(status);
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDir(const std::string& model_dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, FromFile(model_dir + "/tokenizer.json"));
  const std::string config_path = model_dir + "/tokenizer_config.json";
  std::ifstream probe(config_path);
  if (!probe) return tok;
  ASSIGN_OR_RETURN(const std::string text, ReadFile(config_path));
  ASSIGN_OR_RETURN(const Json config, ParseJson(text, config_path));
  if (auto bos = ConfigToken(config, "bos_token")) {
    if (auto id = tok->TokenToId(*bos)) tok->bos_id_ = id;
  }
  if (auto eos = ConfigToken(config, "eos_token")) {
    if (auto id = tok->TokenToId(*eos)) tok->eos_id_ = id;
  }
  return tok;
}

absl::Status Tokenizer::Load(std::string_view json_text) {
  ASSIGN_OR_RETURN(const Json root, ParseJson(json_text, "tokenizer.json"));
  if (!root.is_object()) return json_util::TypeError("tokenizer.json", "an object", root);
  if (const Json* n = json_util::Find(root, "normalizer")) {
    ASSIGN_OR_RETURN(normalizer_, Normalizer::FromJson(*n));
  }
  if (const Json* p = json_util::Find(root, "pre_tokenizer")) {
    ASSIGN_OR_RETURN(pre_tokenizer_, PreTokenizer::FromJson(*p));
  }
  const Json* model = json_util::Find(root, "model");
  if (model == nullptr) return absl::InvalidArgumentError("tokenizer.json: missing model");
  ASSIGN_OR_RETURN(const std::string model_type,
                   json_util::GetStringOr(*model, "type", "model", "BPE"));
  if (model_type != "BPE") return json_util::UnknownType("model", model_type);
  ASSIGN_OR_RETURN(model_,
                   BpeModel::FromJson(*model, pre_tokenizer_ && pre_tokenizer_->byte_level()));
  if (const Json* p = json_util::Find(root, "post_processor")) {
    ASSIGN_OR_RETURN(post_processor_, PostProcessor::FromJson(*p));
  }
  if (const Json* d = json_util::Find(root, "decoder")) {
    ASSIGN_OR_RETURN(decoder_, Decoder::FromJson(*d));
  }
  for (const char* key : {"truncation", "padding"}) {
    if (json_util::Find(root, key) != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json: ", key, " is not supported (must be null)"));
    }
  }
  ASSIGN_OR_RETURN(std::vector<AddedToken> added, ParseAddedTokens(root));
  // Hugging Face gives a token that the model already has the model's id.
  for (AddedToken& t : added) {
    if (auto id = model_->TokenToId(t.content)) t.id = *id;
  }
  ASSIGN_OR_RETURN(added_, AddedVocabulary::Create(std::move(added), normalizer_.get()));

  vocab_size_ = model_->id_limit();
  for (const AddedToken& t : added_->tokens()) vocab_size_ = std::max(vocab_size_, t.id + 1);
  special_ids_.assign(vocab_size_, false);
  for (int32_t id = 0; id < vocab_size_; ++id) {
    const std::string* text = TokenText(id);
    special_ids_[id] = text != nullptr && added_->IsSpecialContent(*text);
  }
  if (decoder_ && decoder_->has_byte_fallback()) {
    fallback_byte_ids_.assign(vocab_size_, false);
    for (int32_t id = 0; id < vocab_size_; ++id) {
      const std::string* text = TokenText(id);
      fallback_byte_ids_[id] = text != nullptr && text->size() == 6 && text->starts_with("<0x") &&
                               text->back() == '>' && std::isxdigit((*text)[3]) &&
                               std::isxdigit((*text)[4]);
    }
  }
  if (post_processor_ && !post_processor_->prefix_ids().empty()) {
    bos_id_ = post_processor_->prefix_ids().front();
  }
  if (decoder_ && decoder_->is_pure_byte_level()) {
    id_bytes_.resize(vocab_size_);
    for (int32_t id = 0; id < vocab_size_; ++id) {
      const std::string* text = TokenText(id);
      if (text == nullptr) continue;
      auto bytes = ByteLevelToBytes(*text);
      id_bytes_[id] = bytes ? std::move(*bytes) : *text;
    }
  }
  return absl::OkStatus();
}

const std::string* Tokenizer::TokenText(int32_t id) const {
  if (const AddedToken* t = added_->FindById(id)) return &t->display;
  return model_->IdToToken(id);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto id = added_->TokenToId(token)) return id;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  const std::string* t = TokenText(id);
  if (t == nullptr) return std::nullopt;
  return *t;
}

absl::Span<const int32_t> Tokenizer::template_prefix_ids() const {
  if (!post_processor_) return {};
  return post_processor_->prefix_ids();
}

bool Tokenizer::has_regex_pre_tokenizer() const {
  return pre_tokenizer_ != nullptr && pre_tokenizer_->byte_level() && pre_tokenizer_->has_regex();
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size_ && special_ids_[id];
}

absl::StatusOr<Encoding> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  return EncodeImpl(text, add_special_tokens, /*continuation=*/false);
}

absl::StatusOr<Encoding> Tokenizer::EncodeContinuation(std::string_view text) const {
  return EncodeImpl(text, /*add_special_tokens=*/false, /*continuation=*/true);
}

absl::StatusOr<Encoding> Tokenizer::EncodeImpl(std::string_view text, bool add_special_tokens,
                                               bool continuation) const {
  if (text.size() >= UINT32_MAX) {
    return absl::InvalidArgumentError("text is too long to encode (4 GiB or more)");
  }
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 (first bad byte at offset ", bad, ")"));
  }
  Encoding enc;
  enc.ids.reserve(text.size() / 3 + 4);
  enc.offsets.reserve(enc.ids.capacity());
  if (added_->has_raw()) {
    std::vector<AddedSplit> splits;
    added_->SplitRaw(text, &splits);
    for (const AddedSplit& s : splits) {
      if (s.id >= 0) {
        enc.ids.push_back(s.id);
        enc.offsets.push_back({static_cast<uint32_t>(s.begin), static_cast<uint32_t>(s.end)});
      } else {
        RETURN_IF_ERROR(EncodeSegment(text.substr(s.begin, s.end - s.begin),
                                      static_cast<uint32_t>(s.begin), continuation && s.begin == 0,
                                      &enc));
      }
    }
  } else if (!text.empty()) {
    RETURN_IF_ERROR(EncodeSegment(text, 0, continuation, &enc));
  }
  if (post_processor_) {
    post_processor_->Process(&enc, add_special_tokens, [this](int32_t id) -> std::string_view {
      const std::string* t = TokenText(id);
      return t == nullptr ? std::string_view() : std::string_view(*t);
    });
  }
  return enc;
}

absl::Status Tokenizer::EncodeSegment(std::string_view text, uint32_t shift, bool continuation,
                                      Encoding* out) const {
  NormalizedString piece(text, shift);
  if (normalizer_) RETURN_IF_ERROR(normalizer_->Normalize(&piece, continuation));
  if (piece.empty()) return absl::OkStatus();
  if (!added_->has_normalized()) return EncodeWords(piece, continuation, out);
  std::vector<AddedSplit> splits;
  added_->SplitNormalized(piece.text(), &splits);
  for (const AddedSplit& s : splits) {
    if (s.id >= 0) {
      const auto [b, e] = piece.OriginalRange(s.begin, s.end);
      out->ids.push_back(s.id);
      out->offsets.push_back({b, e});
    } else {
      RETURN_IF_ERROR(EncodeWords(piece.Slice(s.begin, s.end), continuation && s.begin == 0, out));
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::EncodeWords(const NormalizedString& piece, bool continuation,
                                    Encoding* out) const {
  thread_local std::vector<ModelToken> tokens;
  auto encode_word = [&](const NormalizedString& word) {
    tokens.clear();
    model_->Tokenize(word.text(), &tokens);
    for (const ModelToken& t : tokens) {
      const auto [b, e] = word.OriginalRange(t.begin, t.end);
      out->ids.push_back(t.id);
      out->offsets.push_back({b, e});
    }
  };
  if (!pre_tokenizer_) {
    encode_word(piece);
    return absl::OkStatus();
  }
  std::vector<NormalizedString> words;
  RETURN_IF_ERROR(pre_tokenizer_->PreTokenize(piece, &words, continuation));
  for (const NormalizedString& w : words) encode_word(w);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Encoding>> Tokenizer::EncodeBatch(const std::vector<std::string>& texts,
                                                             bool add_special_tokens,
                                                             int num_threads) const {
  std::vector<Encoding> out(texts.size());
  std::vector<absl::Status> errors(texts.size());
  if (num_threads <= 0)
    num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  num_threads = static_cast<int>(std::min<size_t>(num_threads, texts.size()));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < texts.size(); i = next.fetch_add(1)) {
      auto enc = Encode(texts[i], add_special_tokens);
      if (enc.ok()) {
        out[i] = *std::move(enc);
      } else {
        errors[i] = enc.status();
      }
    }
  };
  if (num_threads <= 1) {
    work();
  } else {
    ForkJoinPool* pool;
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      if (!pool_) {
        const int hw = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
        pool_ = std::make_unique<ForkJoinPool>(hw - 1);
      }
      pool = pool_.get();
    }
    pool->Run(num_threads - 1, work);
  }
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i].ok()) {
      return absl::Status(errors[i].code(), absl::StrCat("text ", i, ": ", errors[i].message()));
    }
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  for (int32_t id : ids) {
    if (TokenText(id) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not in the vocabulary"));
    }
  }
  if (!id_bytes_.empty()) {
    std::string bytes;
    for (int32_t id : ids) {
      if (skip_special_tokens && special_ids_[id]) continue;
      bytes += id_bytes_[id];
    }
    std::string text;
    text.reserve(bytes.size());
    AppendUtf8Lossy(bytes, &text);
    return text;
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (skip_special_tokens && special_ids_[id]) continue;
    tokens.push_back(*TokenText(id));
  }
  if (decoder_) return decoder_->Decode(std::move(tokens));
  return absl::StrJoin(tokens, " ");
}

}  // namespace rl::tokenizer
