// Weight states in tests of delta updates (issue 30): what a worker serves as the test tracks it
// (name -> dtype, shape, bytes), its manifest (the digest the weights checker reports), random
// finite steps of a tensor, and the chunks of a tensor stream carrying changed tensors whole or
// as delta payloads (cut in random pieces, sent in random order after each tensor's first).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/model_io/dtype.h"
#include "common/model_io/safetensors.h"
#include "common/weight_sync/delta.h"
#include "common/weight_sync/manifest.h"
#include "gtest/gtest.h"
#include "rl/v1/admin.pb.h"
#include "tests/testing/tensor_stream.h"

namespace rl::testing {

struct Tensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
// What a worker serves, as the test tracks it.
using State = std::map<std::string, Tensor>;

inline State ReadState(const std::string& dir) {
  State out;
  auto ckpt = model_io::OpenCheckpoint(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  if (!ckpt.ok()) return out;
  for (const auto& [name, t] : ckpt->tensors()) {
    if (!model_io::IsFloatWeightDType(t.dtype)) continue;
    out[name] = {model_io::DTypeName(t.dtype), t.shape,
                 std::vector<uint8_t>(t.data.begin(), t.data.end())};
  }
  return out;
}

inline weight_sync::Manifest ManifestOf(const State& s, int64_t version, int64_t parent) {
  weight_sync::Manifest m;
  m.version = version;
  m.parent_version = parent;
  for (const auto& [name, t] : s) {
    m.tensors[name] = {*model_io::ParseDType(t.dtype), t.shape,
                       weight_sync::TensorSha256(name, t.dtype, t.shape, t.bytes)};
  }
  m.sha256 = weight_sync::ManifestDigest(m.tensors);
  return m;
}

// `parent` with a fraction `density` of its words changed (a contiguous run when `clustered`),
// every new value finite (low mantissa bits flipped).
inline std::vector<uint8_t> Step(model_io::DType dtype, const std::vector<uint8_t>& parent,
                                 double density, bool clustered, std::mt19937& rng) {
  const int width = *weight_sync::DeltaWordBytes(dtype);
  const int64_t n = static_cast<int64_t>(parent.size()) / width;
  const uint32_t mask = width == 2 ? 0x3fu : 0xfffffu;
  std::vector<uint8_t> child = parent;
  auto flip = [&](int64_t i) {
    uint32_t w = 0;
    std::memcpy(&w, child.data() + i * width, static_cast<size_t>(width));
    w ^= 1u + rng() % mask;
    std::memcpy(child.data() + i * width, &w, static_cast<size_t>(width));
  };
  const int64_t changes = static_cast<int64_t>(density * static_cast<double>(n));
  if (clustered && changes > 0) {
    const int64_t start = static_cast<int64_t>(rng() % static_cast<uint32_t>(n - changes + 1));
    for (int64_t i = start; i < start + changes; ++i) flip(i);
  } else {
    std::bernoulli_distribution pick(density);
    for (int64_t i = 0; i < n; ++i) {
      if (pick(rng)) flip(i);
    }
  }
  return child;
}

// One changed tensor as a stream or a group carries it: a delta payload, or whole.
struct Change {
  std::string name;
  Tensor tensor;  // the new value
  std::optional<weight_sync::TensorDelta> delta;
};

// Chunks of `changes` (payloads cut in random pieces), in random order.
inline std::vector<rl::v1::TensorChunk> ChunksOf(const std::vector<Change>& changes,
                                                 std::mt19937& rng) {
  std::vector<rl::v1::TensorChunk> out;
  for (const Change& c : changes) {
    const std::vector<uint8_t>& data = c.delta ? c.delta->payload : c.tensor.bytes;
    const size_t word = c.delta ? 1 : model_io::DTypeSize(*model_io::ParseDType(c.tensor.dtype));
    size_t at = 0;
    do {
      size_t piece = data.empty() ? 0 : 1 + rng() % std::max<size_t>(1, data.size() / 3);
      piece = std::min(data.size() - at, (piece + word - 1) / word * word);
      rl::v1::TensorChunk chunk =
          Chunk(c.name, c.tensor.shape, c.tensor.dtype,
                std::string(reinterpret_cast<const char*>(data.data()) + at, piece), at);
      if (c.delta) {
        chunk.set_encoding(weight_sync::DeltaEncodingName(c.delta->encoding));
        chunk.set_delta_count(c.delta->count);
        // payload_bytes on the tensor's first chunk; later ones repeat it or leave it 0.
        if (at == 0 || rng() % 2 == 0) {
          chunk.set_payload_bytes(static_cast<int64_t>(data.size()));
        }
      } else if (rng() % 2 == 0) {
        chunk.set_encoding("dense");
      }
      out.push_back(std::move(chunk));
      at += piece;
    } while (at < data.size());
  }
  // Payload bytes of a tensor may come in any order; its first chunk (payload_bytes) first.
  std::vector<rl::v1::TensorChunk> firsts, rest;
  for (auto& c : out) (c.offset() == 0 ? firsts : rest).push_back(std::move(c));
  std::shuffle(rest.begin(), rest.end(), rng);
  firsts.insert(firsts.end(), rest.begin(), rest.end());
  return firsts;
}

}  // namespace rl::testing
