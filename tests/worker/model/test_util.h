// Helpers shared by the model tests: golden fixtures, checkpoints re-made from them, greedy
// decoding through a ModelRunner with a trivial slot allocator (paths and temp dirs come from
// tests/testing/test_data.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/model_io/model_maker.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/model_runner.h"
#include "tests/testing/test_data.h"

namespace rl::model::testing {

using ::rl::testing::DataDir;

// A fresh directory `name` for this process's models (test_data.h's ProcessTempDir).
inline std::string FreshTempDir(const std::string& name) {
  return ::rl::testing::ProcessTempDir(name);
}

// The JSON document at `path` (a golden fixture); parse errors throw, failing the test.
inline nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(::rl::testing::ReadFile(path));
}

// Options re-creating the checkpoint a Hugging Face fixture was computed from: its "maker"
// object (arch, size, seed, dtype), written to `out_dir`.
inline model_io::MakeModelOptions MakerOptions(const nlohmann::json& maker,
                                               const std::string& out_dir) {
  model_io::MakeModelOptions mo;
  mo.arch = maker["arch"];
  mo.size = maker["size"];
  mo.seed = maker["seed"];
  mo.dtype = maker["dtype"];
  mo.out_dir = out_dir;
  return mo;
}

inline int32_t Argmax(const float* row, int64_t n) {
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (row[i] > row[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

struct GreedyResult {
  std::vector<float> first_logits;  // logits after the prompt
  std::vector<int32_t> tokens;      // generated tokens
};

// Prefills `prompt` in one step (slots base, base+1, ...) and decodes `steps` tokens greedily.
inline GreedyResult Greedy(ModelRunner* runner, const std::vector<int32_t>& prompt, int steps,
                           int32_t slot_base = 0) {
  GreedyResult r;
  SequenceInput seq;
  seq.token_ids = prompt;
  seq.start_pos = 0;
  for (size_t i = 0; i < prompt.size(); ++i)
    seq.kv_slots.push_back(slot_base + static_cast<int32_t>(i));
  ForwardInput in;
  ForwardOutput out;
  for (int s = 0; s < steps; ++s) {
    in.seqs = {seq};
    absl::Status st = runner->Forward(in, &out);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return r;
    if (s == 0) r.first_logits = out.logits;
    const int32_t next = Argmax(out.logits.data(), out.vocab_size);
    r.tokens.push_back(next);
    seq.start_pos += static_cast<int32_t>(seq.token_ids.size());
    seq.token_ids = {next};
    seq.kv_slots.push_back(slot_base + seq.start_pos);
  }
  return r;
}

}  // namespace rl::model::testing
