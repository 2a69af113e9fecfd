// Tokenizer: a Hugging Face `tokenizer.json` (BPE model) loaded in C++, agreeing with the
// `tokenizers` package byte for byte on ids, offsets and decoded text.
//
// Supported: BPE with merges ("a b" or ["a", "b"]), ignore_merges, byte_fallback, unk
// fusing; added tokens (special or not, lstrip/rstrip/single_word/normalized); normalizers
// NFC/NFD/NFKC/NFKD/Prepend/Replace/Strip; pre-tokenizers Split/ByteLevel/Metaspace;
// post-processors TemplateProcessing/ByteLevel; decoders ByteLevel/Replace/ByteFallback/
// Fuse/Strip/Metaspace; Sequence of each. Any other component type is a load error that
// names it. That covers GPT-2, Qwen2/2.5/3, Llama-2/3 and SentencePiece-style BPE files.
//
// Pipeline of Encode: UTF-8 check -> cut raw added tokens -> normalize each piece (with
// byte alignments) -> cut normalized added tokens -> pre-tokenize -> BPE per word (cached)
// -> post-process (BOS etc. only when add_special_tokens).
// Thread safety: a loaded Tokenizer is immutable; every method is const and may be called
// from any number of threads at once. Cost: loading parses the JSON once (~0.1-1 s for large
// vocabularies); encoding is linear in the text apart from BPE on long words.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tokenizer/encoding.h"

namespace rl::tokenizer {

class AddedVocabulary;
class BpeModel;
class Decoder;
class NormalizedString;
class Normalizer;
class PostProcessor;
class PreTokenizer;
class ForkJoinPool;

class Tokenizer {
 public:
  // Loads a tokenizer.json file.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // Loads tokenizer.json content.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json_text);
  // Loads DIR/tokenizer.json; DIR/tokenizer_config.json, when present, names BOS and EOS.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDir(const std::string& model_dir);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes `text` (UTF-8; InvalidArgument otherwise). With add_special_tokens the
  // post-processor's template tokens (e.g. BOS) are added, with offsets [0, 0).
  absl::StatusOr<Encoding> Encode(std::string_view text, bool add_special_tokens = true) const;

  // Encodes `text` as the rest of a longer text cut at a pre-token boundary: no
  // post-processor tokens (BOS), and at its start no normalizer Prepend, no Metaspace
  // replacement and no ByteLevel prefix space (pieces after added tokens get them as in
  // Encode). When the cut is a pre-token boundary of the longer text's encoding, the ids equal
  // that encoding's ids past the cut. Offsets are relative to `text`.
  absl::StatusOr<Encoding> EncodeContinuation(std::string_view text) const;

  // Encodes every text, on up to `num_threads` threads (0: hardware concurrency). Fails with
  // the first error (naming the index of the text) if any text fails.
  absl::StatusOr<std::vector<Encoding>> EncodeBatch(const std::vector<std::string>& texts,
                                                    bool add_special_tokens = true,
                                                    int num_threads = 0) const;

  // Decodes ids to text; special tokens are left out when skip_special_tokens. Ill-formed
  // UTF-8 produced by byte tokens becomes U+FFFD as in Hugging Face. InvalidArgument for an
  // id outside the vocabulary.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens = false) const;

  // Vocabulary lookups in tokenizer.json form (added tokens first, then the model).
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // One past the largest id (model and added tokens): the embedding table size needed.
  int32_t vocab_size() const { return vocab_size_; }
  // Whether `id` is a special added token (skipped by Decode with skip_special_tokens).
  bool IsSpecial(int32_t id) const;
  // Whether `id` is a "<0xXX>" token that the decoder's ByteFallback groups with its
  // neighbours (stream decoding must not emit text while such a run may still grow).
  bool IsFallbackByte(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < fallback_byte_ids_.size() && fallback_byte_ids_[id];
  }

  // Ids the post-processor puts before the text with add_special_tokens (e.g. BOS); empty
  // when it adds none.
  absl::Span<const int32_t> template_prefix_ids() const;
  // Whether the pre-tokenizer splits with a byte-level regex (GPT-2, Llama-3, Qwen2 style):
  // then a line start followed by a non-space character is a pre-token boundary.
  bool has_regex_pre_tokenizer() const;

  // BOS: named by tokenizer_config.json, else the first token the template prepends.
  std::optional<int32_t> bos_id() const { return bos_id_; }
  // EOS: named by tokenizer_config.json (FromDir only).
  std::optional<int32_t> eos_id() const { return eos_id_; }

 private:
  friend class StreamDecoder;
  Tokenizer();
  absl::Status Load(std::string_view json_text);
  absl::StatusOr<Encoding> EncodeImpl(std::string_view text, bool add_special_tokens,
                                      bool continuation) const;
  absl::Status EncodeSegment(std::string_view text, uint32_t shift, bool continuation,
                             Encoding* out) const;
  absl::Status EncodeWords(const NormalizedString& piece, bool continuation, Encoding* out) const;
  // The tokenizer.json form of `id`, or nullptr when the id is unknown.
  const std::string* TokenText(int32_t id) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<AddedVocabulary> added_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  // Raw bytes of every id, for the pure ByteLevel decoder fast path (empty otherwise).
  std::vector<std::string> id_bytes_;
  std::vector<bool> special_ids_;
  std::vector<bool> fallback_byte_ids_;  // empty unless the decoder has ByteFallback
  // Threads of EncodeBatch, started on first use and reused so their BPE caches stay warm.
  mutable std::mutex pool_mu_;
  mutable std::unique_ptr<ForkJoinPool> pool_;  // guarded by pool_mu_ (creation only)
};

}  // namespace rl::tokenizer
