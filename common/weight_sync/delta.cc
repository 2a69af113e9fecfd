#include "common/weight_sync/delta.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace rl::weight_sync {
namespace {

using model_io::DType;

// A split of an xor literal run costs at least two varint bytes: zero words cheaper than that
// are carried inside the run.
constexpr int64_t kSplitCostBytes = 2;

uint32_t LoadWord(const uint8_t* p, int width) {
  if (width == 2) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void StoreWord(uint8_t* p, int width, uint32_t v) {
  if (width == 2) {
    const auto w = static_cast<uint16_t>(v);
    std::memcpy(p, &w, 2);
  } else {
    std::memcpy(p, &v, 4);
  }
}

// NaN or ±Inf: every exponent bit set.
bool NonFinite(DType dtype, uint32_t word) {
  switch (dtype) {
    case DType::kBF16:
      return (word & 0x7f80u) == 0x7f80u;
    case DType::kF16:
      return (word & 0x7c00u) == 0x7c00u;
    default:
      return (word & 0x7f800000u) == 0x7f800000u;
  }
}

int VarintSize(uint64_t v) {
  int n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void PutVarint(uint64_t v, std::vector<uint8_t>* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<uint8_t>(v));
}

// Reads one varint at *pos; false when the payload ends inside it or it exceeds 64 bits.
bool GetVarint(absl::Span<const uint8_t> in, size_t* pos, uint64_t* out) {
  uint64_t v = 0;
  for (int i = 0; i < 10; ++i) {
    if (*pos >= in.size()) return false;
    const uint8_t b = in[(*pos)++];
    if (i == 9 && b > 1) return false;
    v |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if ((b & 0x80) == 0) {
      *out = v;
      return true;
    }
  }
  return false;
}

absl::Status CheckPair(DType dtype, absl::Span<const uint8_t> parent,
                       absl::Span<const uint8_t> child, int* width) {
  ASSIGN_OR_RETURN(*width, DeltaWordBytes(dtype));
  if (parent.size() != child.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: parent has ", parent.size(), " bytes, child ", child.size()));
  }
  if (parent.size() % static_cast<size_t>(*width) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("delta: ", parent.size(),
                                                   " bytes is not a whole number of ",
                                                   model_io::DTypeName(dtype), " elements"));
  }
  return absl::OkStatus();
}

// Calls fn(index) for every word that differs, in increasing order. Compares 8 bytes at a time.
template <typename Fn>
void ForEachChanged(int width, absl::Span<const uint8_t> a, absl::Span<const uint8_t> b, Fn fn) {
  const size_t n = a.size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, a.data() + i, 8);
    std::memcpy(&y, b.data() + i, 8);
    if (x == y) continue;
    for (size_t j = i; j < i + 8; j += static_cast<size_t>(width)) {
      if (std::memcmp(a.data() + j, b.data() + j, static_cast<size_t>(width)) != 0) {
        fn(static_cast<int64_t>(j) / width);
      }
    }
  }
  for (; i < n; i += static_cast<size_t>(width)) {
    if (std::memcmp(a.data() + i, b.data() + i, static_cast<size_t>(width)) != 0) {
      fn(static_cast<int64_t>(i) / width);
    }
  }
}

// The xor runs of a change set: literal runs that swallow zero gaps cheaper than a split.
// Calls run(zeros, start, n) per run, covering [0, num_words).
template <typename RunFn>
void ForEachXorRun(int width, int64_t num_words, absl::Span<const uint8_t> a,
                   absl::Span<const uint8_t> b, RunFn run) {
  int64_t pos = 0;  // first word not covered yet
  int64_t lit_start = -1;
  int64_t lit_end = -1;
  ForEachChanged(width, a, b, [&](int64_t i) {
    if (lit_start >= 0 && (i - lit_end) * width <= kSplitCostBytes) {
      lit_end = i + 1;
      return;
    }
    if (lit_start >= 0) {
      run(lit_start - pos, lit_start, lit_end - lit_start);
      pos = lit_end;
    }
    lit_start = i;
    lit_end = i + 1;
  });
  if (lit_start >= 0) {
    run(lit_start - pos, lit_start, lit_end - lit_start);
    pos = lit_end;
  }
  if (pos < num_words) run(num_words - pos, num_words, 0);
}

absl::StatusOr<TensorDelta> Encode(DeltaEncoding encoding, int width,
                                   absl::Span<const uint8_t> parent,
                                   absl::Span<const uint8_t> child, int64_t reserve) {
  TensorDelta d;
  d.encoding = encoding;
  d.payload.reserve(static_cast<size_t>(reserve));
  const int64_t num_words = static_cast<int64_t>(parent.size()) / width;
  if (encoding == DeltaEncoding::kOverwrite) {
    int64_t prev = -1;
    ForEachChanged(width, parent, child, [&](int64_t i) {
      PutVarint(static_cast<uint64_t>(i - prev - 1), &d.payload);
      const uint8_t* w = child.data() + i * width;
      d.payload.insert(d.payload.end(), w, w + width);
      prev = i;
      ++d.count;
    });
    return d;
  }
  ForEachXorRun(width, num_words, parent, child, [&](int64_t zeros, int64_t start, int64_t n) {
    PutVarint(static_cast<uint64_t>(zeros), &d.payload);
    PutVarint(static_cast<uint64_t>(n), &d.payload);
    for (int64_t k = start; k < start + n; ++k) {
      const uint32_t x =
          LoadWord(parent.data() + k * width, width) ^ LoadWord(child.data() + k * width, width);
      const size_t at = d.payload.size();
      d.payload.resize(at + static_cast<size_t>(width));
      StoreWord(d.payload.data() + at, width, x);
    }
    d.count += n;
  });
  return d;
}

// One pass over `delta` against `target`: checks everything; with kWrite also writes. Called
// once to check, then once to write, so a refused delta writes nothing.
template <bool kWrite>
absl::Status Walk(DType dtype, int width, const DeltaView& delta, absl::Span<uint8_t> target,
                  const ApplyOptions& options) {
  const int64_t num_words = static_cast<int64_t>(target.size()) / width;
  const absl::Span<const uint8_t> in = delta.payload;
  size_t pos = 0;
  auto value_check = [&](int64_t index, uint32_t word) -> absl::Status {
    if (options.allow_non_finite || !NonFinite(dtype, word)) return absl::OkStatus();
    uint8_t bytes[4];
    StoreWord(bytes, width, word);
    return absl::InvalidArgumentError(absl::StrCat("delta: element ", index, " would become ",
                                                   model_io::NonFiniteName(dtype, bytes),
                                                   " (non-finite weights are refused)"));
  };
  if (delta.count < 0 || delta.count > num_words) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: count ", delta.count, " is outside [0, ", num_words, "] elements"));
  }
  if (delta.encoding == DeltaEncoding::kOverwrite) {
    int64_t prev = -1;
    for (int64_t e = 0; e < delta.count; ++e) {
      uint64_t gap;
      if (!GetVarint(in, &pos, &gap)) {
        return absl::InvalidArgumentError(
            absl::StrCat("delta: overwrite entry ", e, " of ", delta.count,
                         ": the payload ends inside its index or the index is malformed"));
      }
      if (gap >= static_cast<uint64_t>(num_words - prev - 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "delta: overwrite entry ", e, ": index past the tensor's ", num_words, " elements"));
      }
      const int64_t index = prev + 1 + static_cast<int64_t>(gap);
      if (in.size() - pos < static_cast<size_t>(width)) {
        return absl::InvalidArgumentError(
            absl::StrCat("delta: overwrite entry ", e, ": the payload ends inside its value"));
      }
      const uint32_t word = LoadWord(in.data() + pos, width);
      pos += static_cast<size_t>(width);
      RETURN_IF_ERROR(value_check(index, word));
      if constexpr (kWrite) StoreWord(target.data() + index * width, width, word);
      prev = index;
    }
  } else {
    int64_t covered = 0;
    int64_t carried = 0;
    while (covered < num_words) {
      uint64_t zeros, n;
      if (!GetVarint(in, &pos, &zeros) || !GetVarint(in, &pos, &n)) {
        return absl::InvalidArgumentError(
            absl::StrCat("delta: xor runs cover ", covered, " of ", num_words,
                         " elements: the payload ends inside a run header or it is malformed"));
      }
      const auto left = static_cast<uint64_t>(num_words - covered);
      if (zeros > left || n > left - zeros || zeros + n == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "delta: xor run at element ", covered, " (", zeros, " unchanged, ", n,
            " changed) does not fit the tensor's ", num_words, " elements or makes no progress"));
      }
      covered += static_cast<int64_t>(zeros);
      if (static_cast<uint64_t>(in.size() - pos) / static_cast<uint64_t>(width) < n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "delta: xor run at element ", covered, ": the payload ends inside its ", n, " words"));
      }
      for (uint64_t k = 0; k < n; ++k, ++covered) {
        uint8_t* t = target.data() + covered * width;
        const uint32_t word = LoadWord(t, width) ^ LoadWord(in.data() + pos, width);
        pos += static_cast<size_t>(width);
        RETURN_IF_ERROR(value_check(covered, word));
        if constexpr (kWrite) StoreWord(t, width, word);
      }
      carried += static_cast<int64_t>(n);
    }
    if (carried != delta.count) {
      return absl::InvalidArgumentError(
          absl::StrCat("delta: xor runs carry ", carried, " words, the header says ", delta.count));
    }
  }
  if (pos != in.size()) {
    return absl::InvalidArgumentError(absl::StrCat("delta: ", in.size() - pos,
                                                   " bytes left over after the ", delta.count,
                                                   " entries the header announces"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* DeltaEncodingName(DeltaEncoding encoding) {
  return encoding == DeltaEncoding::kOverwrite ? "overwrite" : "xor";
}

std::optional<DeltaEncoding> ParseDeltaEncoding(absl::string_view name) {
  if (name == "overwrite") return DeltaEncoding::kOverwrite;
  if (name == "xor") return DeltaEncoding::kXor;
  return std::nullopt;
}

absl::StatusOr<int> DeltaWordBytes(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF32:
      return 4;
    default:
      return absl::InvalidArgumentError(absl::StrCat("delta: dtype ", model_io::DTypeName(dtype),
                                                     " (deltas cover F32, BF16 and F16)"));
  }
}

absl::StatusOr<int64_t> MaxDeltaPayloadBytes(DeltaEncoding encoding, int64_t count,
                                             int64_t num_words, int word_bytes) {
  if (count < 0 || num_words < 0 || count > num_words) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: count ", count, " is outside [0, ", num_words, "] elements"));
  }
  constexpr int64_t kMaxVarintBytes = 10;
  // Overwrite: one index varint and one word per entry. Xor: the words carried, plus two varints
  // per run; EncodeDelta writes at most one run per carried word, plus a last unchanged run.
  if (encoding == DeltaEncoding::kOverwrite) return count * (kMaxVarintBytes + word_bytes);
  return count * word_bytes + 2 * kMaxVarintBytes * (count + 1);
}

absl::StatusOr<int64_t> CountChangedWords(DType dtype, absl::Span<const uint8_t> parent,
                                          absl::Span<const uint8_t> child) {
  int width = 0;
  RETURN_IF_ERROR(CheckPair(dtype, parent, child, &width));
  int64_t n = 0;
  ForEachChanged(width, parent, child, [&](int64_t) { ++n; });
  return n;
}

absl::StatusOr<TensorDelta> EncodeDeltaAs(DeltaEncoding encoding, DType dtype,
                                          absl::Span<const uint8_t> parent,
                                          absl::Span<const uint8_t> child) {
  int width = 0;
  RETURN_IF_ERROR(CheckPair(dtype, parent, child, &width));
  return Encode(encoding, width, parent, child, 0);
}

absl::StatusOr<TensorDelta> EncodeDelta(DType dtype, absl::Span<const uint8_t> parent,
                                        absl::Span<const uint8_t> child) {
  int width = 0;
  RETURN_IF_ERROR(CheckPair(dtype, parent, child, &width));
  // Both sizes in one pass each, then the smaller is written.
  int64_t overwrite_bytes = 0;
  int64_t prev = -1;
  ForEachChanged(width, parent, child, [&](int64_t i) {
    overwrite_bytes += VarintSize(static_cast<uint64_t>(i - prev - 1)) + width;
    prev = i;
  });
  int64_t xor_bytes = 0;
  ForEachXorRun(width, static_cast<int64_t>(parent.size()) / width, parent, child,
                [&](int64_t zeros, int64_t, int64_t n) {
                  xor_bytes += VarintSize(static_cast<uint64_t>(zeros)) +
                               VarintSize(static_cast<uint64_t>(n)) + n * width;
                });
  if (overwrite_bytes <= xor_bytes) {
    return Encode(DeltaEncoding::kOverwrite, width, parent, child, overwrite_bytes);
  }
  return Encode(DeltaEncoding::kXor, width, parent, child, xor_bytes);
}

absl::Status ApplyDelta(DType dtype, const DeltaView& delta, absl::Span<uint8_t> target,
                        const ApplyOptions& options) {
  ASSIGN_OR_RETURN(const int width, DeltaWordBytes(dtype));
  if (target.size() % static_cast<size_t>(width) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("delta: target of ", target.size(),
                                                   " bytes is not a whole number of ",
                                                   model_io::DTypeName(dtype), " elements"));
  }
  RETURN_IF_ERROR(Walk<false>(dtype, width, delta, target, options));
  return Walk<true>(dtype, width, delta, target, options);
}

}  // namespace rl::weight_sync
