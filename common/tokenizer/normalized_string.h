// NormalizedString: a piece of text being normalized, with the alignment of every byte of
// the normalized text to a byte range of the caller's original text.
//
// Invariants: text() is valid UTF-8; each normalized byte maps to [begin, end) in the
// original (absolute offsets into the string passed to Encode); a piece that no operation
// has changed keeps no alignment table at all ("identity"): its byte i maps to the
// original character that contains it, shifted by the piece's start, so the common
// no-normalizer path costs nothing. The edits reproduce the alignment rules of Hugging
// Face's NormalizedString::transform_range, so token offsets match theirs byte for byte.
// Cost: an edit is O(length) and materializes an 8-byte-per-byte alignment table.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace rl::tokenizer {

struct Alignment {
  uint32_t begin;
  uint32_t end;
};

class NormalizedString {
 public:
  NormalizedString() = default;
  // A view of `original` (which must outlive this object and every unmodified slice of it)
  // that starts at byte `shift` of the caller's text.
  NormalizedString(std::string_view original, uint32_t shift)
      : view_(original), shift_(shift), original_start_(shift) {}

  NormalizedString(const NormalizedString& other) { *this = other; }
  NormalizedString& operator=(const NormalizedString& other);
  NormalizedString(NormalizedString&& other) noexcept { *this = std::move(other); }
  NormalizedString& operator=(NormalizedString&& other) noexcept;

  std::string_view text() const { return owned_ ? std::string_view(text_) : view_; }
  size_t size() const { return text().size(); }
  bool empty() const { return text().empty(); }

  // Where this piece started in the original text before any edit (Hugging Face's
  // `offsets_original().0`).
  uint32_t original_start() const { return original_start_; }

  // Original byte range of the normalized bytes [begin, end); begin < end.
  std::pair<uint32_t, uint32_t> OriginalRange(size_t begin, size_t end) const;

  // The normalized bytes [begin, end) (on character boundaries) as their own string.
  NormalizedString Slice(size_t begin, size_t end) const;

  // Edits, each with the alignment rule Hugging Face uses for it.
  void Prepend(std::string_view prefix);
  void Append(std::string_view suffix);
  // Replaces the byte ranges `matches` (sorted, disjoint) with `content`.
  void ReplaceRanges(const std::vector<std::pair<size_t, size_t>>& matches,
                     std::string_view content);
  void Strip(bool left, bool right);
  enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
  absl::Status Normalize(NormalForm form);

 private:
  Alignment AlignAt(size_t byte) const;
  void Materialize();
  void SetOwned(std::string text, std::vector<Alignment> align);

  std::string_view view_;
  std::string text_;
  bool owned_ = false;
  uint32_t shift_ = 0;
  uint32_t original_start_ = 0;
  std::vector<Alignment> align_;  // empty while the string is an identity view
};

}  // namespace rl::tokenizer
