// The collector's prompt set: JSONL, one row per prompt.
//
// Row fields: `index` (required integer, unique in the file), exactly one of `text` (string) or
// `input_ids` (array of token ids), optional `sampling_params` (object overriding the command
// line's sampling for this row: max_new_tokens, min_new_tokens, temperature, top_p, top_k,
// min_p, repetition_penalty, frequency_penalty, presence_penalty, seed, stop, stop_token_ids,
// ignore_eos), optional `routing_key` (string: the router's routing key for the row's samples,
// instead of the row's group id). Every other field is metadata, carried through to the output
// unchanged (routing_key too).
// Loading checks everything before any request is sent and fails naming the line and field.
// Bounds: a line is at most kMaxLineBytes, a file at most kMaxRows rows, a prompt at most
// kMaxPromptIds ids. Cost: the whole set is held in memory (the rows' text and ids).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rl/v1/generate.pb.h"

namespace rl::collector {

inline constexpr size_t kMaxLineBytes = 16u << 20;
inline constexpr size_t kMaxRows = 50'000'000;
inline constexpr size_t kMaxPromptIds = 1u << 20;
// Samples per prompt (--n).
inline constexpr int32_t kMaxSamplesPerPrompt = 1024;
// Samples in one collection (rows x --n): bounds the task list and a checkpoint's total.
inline constexpr int64_t kMaxSamples = 50'000'000;

struct PromptRow {
  int64_t index = 0;
  int64_t group = 0;  // position of the row in the file
  bool has_text = false;
  std::string text;
  std::vector<int32_t> input_ids;
  std::string sampling_json;  // "" when the row has no overrides
  std::string routing_key;    // the row's `routing_key` field ("": none; also metadata)
  std::string metadata_json = "{}";
};

struct PromptSet {
  std::vector<PromptRow> rows;
  std::string sha256;  // of the file's bytes, to refuse resuming with another prompt set
};

absl::StatusOr<PromptSet> LoadPromptSet(const std::string& path);
// Parses one JSONL line (1-based `line_no` for errors).
absl::StatusOr<PromptRow> ParsePromptRow(const std::string& line, size_t line_no);

// Applies a row's sampling overrides (validated JSON object) onto `params`.
absl::Status ApplySamplingOverrides(const std::string& sampling_json,
                                    rl::v1::SamplingParams* params);

}  // namespace rl::collector
