// What one forward pass takes and returns: the plain batch structs shared by the ModelRunner
// interface (model_runner.h) and the engine's stages (scheduler, sampler), so the engine's
// policy code needs no runner header. No behaviour, no dependencies.
#pragma once

#include <cstdint>
#include <vector>

namespace rl::model {

enum class LogitsMode {
  kNone,  // no logits for this sequence (a prefill chunk that is not the last one)
  kLast,  // one row: the last token of this step
  kAll,   // one row per token processed this step (prompt logprobs)
};

struct SequenceInput {
  // Tokens processed this step (prefill chunk or one decode token).
  std::vector<int32_t> token_ids;
  // Number of tokens of this sequence already in the KV cache; the new tokens take positions
  // start_pos .. start_pos + token_ids.size() - 1.
  int32_t start_pos = 0;
  // KV slot of every position 0 .. start_pos + token_ids.size() - 1 (read the first start_pos,
  // write the rest).
  std::vector<int32_t> kv_slots;
  LogitsMode logits = LogitsMode::kLast;
};

struct ForwardInput {
  std::vector<SequenceInput> seqs;
  // MoE models: fill ForwardOutput's routed experts for every token of the step (R3 export).
  bool return_routing = false;
};

struct ForwardOutput {
  int64_t vocab_size = 0;
  // Rows of logits in float32, [num_rows, vocab_size], in sequence order.
  std::vector<float> logits;
  // Sequence i's rows are [row_begin[i], row_begin[i + 1]); size seqs.size() + 1.
  std::vector<int64_t> row_begin;
  // With ForwardInput::return_routing on an MoE model (else empty): per token of the step, in
  // batch order (sequence by sequence, token_ids order), per MoE layer (config.MoeLayers()), per
  // top-k slot: the chosen expert id and its routing weight, row-major
  // [num_tokens, num_moe_layers, top_k].
  std::vector<int32_t> routed_experts;
  std::vector<float> routed_weights;
};

}  // namespace rl::model
