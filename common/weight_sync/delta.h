// Tensor deltas: one tensor's change from a parent version to a child version, encoded as the
// words that differ, for delta publications (docs/weight-publications.md). Pure value code: no
// I/O, no threads; shared by the worker (apply), the trainer-side writers and rlctl (encode).
//
// Two encodings of the raw little-endian words (2 bytes for BF16/F16, 4 for F32), chosen per
// tensor by encoded size:
//   overwrite  `count` entries, each  varint(gap) word : the entry's index is the previous
//              entry's + 1 + gap (the first: gap), its new value the word. Small for scattered
//              changes (2% changed bf16 elements: about 3% of the dense bytes).
//   xor        runs covering every word of the tensor, each  varint(zeros) varint(n) n words :
//              `zeros` words unchanged, then `n` words XORed into the parent's. Small for
//              clustered or dense changes (no index per element). `count` is the words carried.
// Varints are unsigned LEB128 (at most 10 bytes, no overflow past 64 bits).
//
// Decoding is for attacker-controlled input: ApplyDelta checks the whole payload against the
// tensor before it writes a byte (every index in range and increasing, every run inside the
// tensor, counts equal to `count`, the payload consumed exactly, no value non-finite unless
// allowed), so a refused delta changes nothing. Cost: encode reads both tensors once per
// candidate encoding (8-byte words compared at a time); apply reads the payload twice and writes
// the changed words only.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/model_io/dtype.h"

namespace rl::weight_sync {

enum class DeltaEncoding { kOverwrite, kXor };

// "overwrite" | "xor".
const char* DeltaEncodingName(DeltaEncoding encoding);
std::optional<DeltaEncoding> ParseDeltaEncoding(absl::string_view name);

// An encoded delta viewed in place (a delta file's bytes).
struct DeltaView {
  DeltaEncoding encoding = DeltaEncoding::kOverwrite;
  int64_t count = 0;  // overwrite: entries; xor: words carried
  absl::Span<const uint8_t> payload;
};

struct TensorDelta {
  DeltaEncoding encoding = DeltaEncoding::kOverwrite;
  int64_t count = 0;  // overwrite: entries; xor: words carried
  std::vector<uint8_t> payload;

  DeltaView view() const { return {encoding, count, payload}; }
};

// Bytes per word of `dtype`: 2 (BF16, F16) or 4 (F32); InvalidArgument for any other dtype.
absl::StatusOr<int> DeltaWordBytes(model_io::DType dtype);

// The largest payload an encoding of `count` entries (overwrite) or carried words (xor) of
// `word_bytes`-byte words can take with the runs EncodeDelta writes (varints at their longest):
// a transport bounds what it buffers for one tensor's payload by it before allocating. `count`
// must be in [0, num_words] (InvalidArgument otherwise, naming the numbers).
absl::StatusOr<int64_t> MaxDeltaPayloadBytes(DeltaEncoding encoding, int64_t count,
                                             int64_t num_words, int word_bytes);

// Elements of `dtype` that differ (bitwise) between `parent` and `child` (equal sizes, a whole
// number of words; InvalidArgument otherwise).
absl::StatusOr<int64_t> CountChangedWords(model_io::DType dtype, absl::Span<const uint8_t> parent,
                                          absl::Span<const uint8_t> child);

// The smaller of the two encodings of `child` against `parent` (ties: overwrite). An unchanged
// tensor encodes as overwrite with count 0 and an empty payload.
absl::StatusOr<TensorDelta> EncodeDelta(model_io::DType dtype, absl::Span<const uint8_t> parent,
                                        absl::Span<const uint8_t> child);
// The given encoding, whatever its size (tests, benchmarks).
absl::StatusOr<TensorDelta> EncodeDeltaAs(DeltaEncoding encoding, model_io::DType dtype,
                                          absl::Span<const uint8_t> parent,
                                          absl::Span<const uint8_t> child);

struct ApplyOptions {
  // Accept NaN / ±Inf in the words the delta writes (rl-worker --allow-non-finite-weights).
  bool allow_non_finite = false;
};

// Applies `delta` to `target` (the parent's bytes, a copy the caller owns) in place. Checks all
// of the payload first (see the file comment): on error `target` is unchanged and the message
// names the problem (the caller adds the tensor's name). `target.size()` must be a whole number
// of words of `dtype`.
absl::Status ApplyDelta(model_io::DType dtype, const DeltaView& delta, absl::Span<uint8_t> target,
                        const ApplyOptions& options = {});

}  // namespace rl::weight_sync
