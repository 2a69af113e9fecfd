#include "common/tokenizer/normalized_string.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/unistr.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode.h"

namespace rl::tokenizer {

NormalizedString& NormalizedString::operator=(const NormalizedString& other) {
  if (this == &other) return *this;
  text_ = other.text_;
  owned_ = other.owned_;
  view_ = owned_ ? std::string_view() : other.view_;
  shift_ = other.shift_;
  original_start_ = other.original_start_;
  align_ = other.align_;
  return *this;
}

NormalizedString& NormalizedString::operator=(NormalizedString&& other) noexcept {
  if (this == &other) return *this;
  text_ = std::move(other.text_);
  owned_ = other.owned_;
  view_ = owned_ ? std::string_view() : other.view_;
  shift_ = other.shift_;
  original_start_ = other.original_start_;
  align_ = std::move(other.align_);
  return *this;
}

Alignment NormalizedString::AlignAt(size_t byte) const {
  if (!align_.empty()) return align_[byte];
  const std::string_view t = view_;
  size_t begin = byte;
  while (begin > 0 && IsUtf8Continuation(static_cast<uint8_t>(t[begin]))) --begin;
  const size_t end = begin + Utf8SeqLen(static_cast<uint8_t>(t[begin]));
  return {static_cast<uint32_t>(shift_ + begin), static_cast<uint32_t>(shift_ + end)};
}

std::pair<uint32_t, uint32_t> NormalizedString::OriginalRange(size_t begin, size_t end) const {
  return {AlignAt(begin).begin, AlignAt(end - 1).end};
}

NormalizedString NormalizedString::Slice(size_t begin, size_t end) const {
  if (!owned_) return NormalizedString(view_.substr(begin, end - begin), shift_ + begin);
  NormalizedString out;
  out.SetOwned(text_.substr(begin, end - begin),
               std::vector<Alignment>(align_.begin() + begin, align_.begin() + end));
  out.original_start_ = begin < end ? align_[begin].begin : original_start_;
  return out;
}

void NormalizedString::SetOwned(std::string text, std::vector<Alignment> align) {
  text_ = std::move(text);
  align_ = std::move(align);
  owned_ = true;
  view_ = std::string_view();
}

void NormalizedString::Materialize() {
  if (owned_) return;
  std::vector<Alignment> align(view_.size());
  size_t pos = 0;
  while (pos < view_.size()) {
    const size_t len = Utf8SeqLen(static_cast<uint8_t>(view_[pos]));
    const Alignment a{static_cast<uint32_t>(shift_ + pos),
                      static_cast<uint32_t>(shift_ + pos + len)};
    for (size_t i = 0; i < len; ++i) align[pos + i] = a;
    pos += len;
  }
  SetOwned(std::string(view_), std::move(align));
}

void NormalizedString::Prepend(std::string_view prefix) {
  if (empty() || prefix.empty()) return;
  Materialize();
  const Alignment first = align_[0];
  text_.insert(0, prefix);
  align_.insert(align_.begin(), prefix.size(), first);
}

void NormalizedString::Append(std::string_view suffix) {
  if (empty() || suffix.empty()) return;
  Materialize();
  const Alignment last = align_.back();
  text_.append(suffix);
  align_.insert(align_.end(), suffix.size(), last);
}

void NormalizedString::ReplaceRanges(const std::vector<std::pair<size_t, size_t>>& matches,
                                     std::string_view content) {
  if (matches.empty()) return;
  Materialize();
  std::string text;
  std::vector<Alignment> align;
  text.reserve(text_.size() + matches.size() * content.size());
  align.reserve(text.capacity());
  size_t prev = 0;
  for (const auto& [begin, end] : matches) {
    text.append(text_, prev, begin - prev);
    align.insert(align.end(), align_.begin() + prev, align_.begin() + begin);
    // Inserted characters share the alignment of the byte just before the insertion point,
    // which (after removing the match) is the last byte of the match.
    const Alignment a = end > 0 ? align_[end - 1] : Alignment{0, 0};
    text.append(content);
    align.insert(align.end(), content.size(), a);
    prev = end;
  }
  text.append(text_, prev, std::string::npos);
  align.insert(align.end(), align_.begin() + prev, align_.end());
  SetOwned(std::move(text), std::move(align));
}

void NormalizedString::Strip(bool left, bool right) {
  const std::string_view t = text();
  size_t begin = 0;
  size_t end = t.size();
  if (left) {
    while (begin < end) {
      size_t len;
      if (!IsWhitespace(DecodeUtf8(t, begin, &len))) break;
      begin += len;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && IsUtf8Continuation(static_cast<uint8_t>(t[start]))) --start;
      size_t len;
      if (!IsWhitespace(DecodeUtf8(t, start, &len))) break;
      end = start;
    }
  }
  if (begin == 0 && end == t.size()) return;
  const uint32_t start = original_start_;
  *this = Slice(begin, end);
  original_start_ = start;
}

namespace {

// One character of a segment being normalized, with Hugging Face's change marker: 0 when it
// replaces the next original character, 1 when it is inserted, -n when it also swallows the
// n original characters after that.
struct Tracked {
  UChar32 c;
  int change;
  uint8_t ccc;
};

// Decomposes, reorders and (for the composed forms) recomposes one segment, tracking the
// changes like the `unicode-normalization-alignments` crate: the characters a decomposition
// adds are insertions, and composing two characters sums their changes minus one.
void NormalizeTracked(std::string_view seg, const icu::Normalizer2* decomposer,
                      const icu::Normalizer2* composer, std::vector<Tracked>* out) {
  std::vector<Tracked> d;
  size_t pos = 0;
  icu::UnicodeString decomposition;
  while (pos < seg.size()) {
    size_t len;
    const UChar32 c = static_cast<UChar32>(DecodeUtf8(seg, pos, &len));
    pos += len;
    if (decomposer->getDecomposition(c, decomposition)) {
      int change = 0;
      for (int32_t i = 0; i < decomposition.length();) {
        const UChar32 dc = decomposition.char32At(i);
        d.push_back({dc, change, decomposer->getCombiningClass(dc)});
        change = 1;
        i += U16_LENGTH(dc);
      }
    } else {
      d.push_back({c, 0, decomposer->getCombiningClass(c)});
    }
  }
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < d.size();) {
    if (d[i].ccc == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && d[j].ccc != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [](const Tracked& a, const Tracked& b) { return a.ccc < b.ccc; });
    i = j;
  }
  if (composer == nullptr) {
    *out = std::move(d);
    return;
  }
  out->clear();
  int64_t starter = -1;
  for (const Tracked& t : d) {
    if (starter >= 0) {
      const bool adjacent = static_cast<int64_t>(out->size()) - 1 == starter;
      const uint8_t last_ccc = out->back().ccc;
      if (adjacent || (last_ccc != 0 && last_ccc < t.ccc)) {
        Tracked& s = (*out)[starter];
        const UChar32 composite = composer->composePair(s.c, t.c);
        if (composite >= 0) {
          s.c = composite;
          s.change = s.change + t.change - 1;
          s.ccc = composer->getCombiningClass(composite);
          continue;
        }
      }
    }
    if (t.ccc == 0) starter = static_cast<int64_t>(out->size());
    out->push_back(t);
  }
}

}  // namespace

absl::Status NormalizedString::Normalize(NormalForm form) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* norm = nullptr;
  const icu::Normalizer2* decomposer = nullptr;
  const icu::Normalizer2* composer = nullptr;
  switch (form) {
    case NormalForm::kNfc:
      norm = composer = icu::Normalizer2::getNFCInstance(err);
      decomposer = icu::Normalizer2::getNFDInstance(err);
      break;
    case NormalForm::kNfd:
      norm = decomposer = icu::Normalizer2::getNFDInstance(err);
      break;
    case NormalForm::kNfkc:
      norm = icu::Normalizer2::getNFKCInstance(err);
      composer = icu::Normalizer2::getNFCInstance(err);
      decomposer = icu::Normalizer2::getNFKDInstance(err);
      break;
    case NormalForm::kNfkd:
      norm = decomposer = icu::Normalizer2::getNFKDInstance(err);
      break;
  }
  if (U_FAILURE(err)) {
    return absl::InternalError(absl::StrCat("ICU normalizer unavailable: ", u_errorName(err)));
  }
  const std::string_view t = text();
  const bool normalized = norm->isNormalizedUTF8(icu::StringPiece(t.data(), t.size()), err);
  if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("ICU: ", u_errorName(err)));
  if (normalized) return absl::OkStatus();

  Materialize();
  std::string text;
  std::vector<Alignment> align;
  text.reserve(text_.size() + 16);
  align.reserve(text_.size() + 16);
  std::vector<Tracked> chars;
  size_t pos = 0;
  while (pos < text_.size()) {
    // A segment runs from one normalization boundary to the next; segments normalize
    // independently of each other.
    size_t end = pos;
    size_t len;
    DecodeUtf8(text_, end, &len);
    end += len;
    while (end < text_.size()) {
      const char32_t c = DecodeUtf8(text_, end, &len);
      if (norm->hasBoundaryBefore(static_cast<UChar32>(c))) break;
      end += len;
    }
    const std::string_view seg(text_.data() + pos, end - pos);
    if (norm->isNormalizedUTF8(icu::StringPiece(seg.data(), seg.size()), err)) {
      text.append(seg);
      align.insert(align.end(), align_.begin() + pos, align_.begin() + end);
    } else {
      NormalizeTracked(seg, decomposer, composer, &chars);
      // Hugging Face's transform: a replacing character takes the alignment of the next
      // original character and consumes it (plus -change more); an inserted one shares the
      // alignment of the byte before it.
      size_t offset = pos;
      for (const Tracked& tc : chars) {
        const size_t before = text.size();
        AppendUtf8(static_cast<char32_t>(tc.c), &text);
        const size_t out_len = text.size() - before;
        Alignment a;
        if (tc.change > 0) {
          a = offset > 0 ? align_[offset - 1] : Alignment{0, 0};
        } else {
          a = align_[std::min(offset, align_.size() - 1)];
          for (int k = 0; k < 1 - tc.change && offset < end; ++k) {
            offset += Utf8SeqLen(static_cast<uint8_t>(text_[offset]));
          }
        }
        align.insert(align.end(), out_len, a);
      }
    }
    if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("ICU: ", u_errorName(err)));
    pos = end;
  }
  SetOwned(std::move(text), std::move(align));
  return absl::OkStatus();
}

}  // namespace rl::tokenizer
