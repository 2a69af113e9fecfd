// Element types of checkpoint tensors and the float conversions the model layer needs.
//
// Safetensors names dtypes by strings ("F32", "BF16", ...). The runner computes in float32 and
// reads F32 / BF16 / F16 weights directly; the other dtypes are recognised so that a checkpoint
// listing them (e.g. an I64 buffer) parses, but they are flagged as not loadable as weights.
// Conversions are exact for widening and round-to-nearest-even for narrowing; all are O(1).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace rl::model_io {

enum class DType { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

// "F32", "BF16", ...: the safetensors spelling.
const char* DTypeName(DType dtype);
// Parses a safetensors dtype string; nullopt for an unknown one.
std::optional<DType> ParseDType(std::string_view name);
// Bytes per element.
int64_t DTypeSize(DType dtype);
// True for the dtypes weights may be stored in (F32, F16, BF16).
bool IsFloatWeightDType(DType dtype);

// The element count of `shape` with checked arithmetic (one helper for checkpoint headers and
// tensor-update chunks): InvalidArgument "shape[i]: D is negative" or "shape: the element count
// overflows at dimension i" (a product above 2^62). Callers still check the byte size
// (count x DTypeSize) against their bound by division, never by a multiplication that can wrap.
// An empty shape is a scalar (1 element).
absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape);

inline float Bf16ToF32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float F16ToF32(uint16_t v);
uint16_t F32ToF16(float f);

// The index of the first NaN or ±Inf among `n` elements of `data` (F32, F16 or BF16; any
// alignment), or -1 when all are finite (always -1 for other dtypes). Branch-free blocks the
// compiler vectorises (an OR of exponent tests per block), so it runs at cache bandwidth.
int64_t FindNonFinite(DType dtype, const void* data, int64_t n);
// "NaN", "+Inf" or "-Inf" for a non-finite element of `dtype` at `data`.
const char* NonFiniteName(DType dtype, const void* data);

// Converts `n` elements of `src` (F32, F16 or BF16) to float32.
void ConvertToF32(DType src_dtype, const void* src, int64_t n, float* dst);
// Converts `n` float32 values to `dst_dtype` (F32, F16 or BF16).
void ConvertFromF32(const float* src, int64_t n, DType dst_dtype, void* dst);

}  // namespace rl::model_io
