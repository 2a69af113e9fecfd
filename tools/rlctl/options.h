// rlctl's parsed command line: every flag of every command (main.cc fills it, the commands read
// the fields they need).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rl::rlctl {

// generate --max-version-lag not given (the server checks every value that is).
inline constexpr int kUnsetVersionLag = -1000000;

struct Options {
  std::string target = "127.0.0.1:50051";
  std::string api_key;
  bool json = false;
  double timeout_s = 60;
  std::string text;
  bool text_set = false;  // --text given, even empty
  std::string file;       // tokenize: the whole file as one text
  std::string request_id;
  std::string resume_id;  // generate --resume-id: resume a kept partial sample (router)
  std::string episode_id;
  bool remove = false;             // episode: forget it once exported
  bool routed_experts = false;     // episode: each sample's routing (R3)
  bool expert_weights = false;     // episode: and its routing weights
  bool all = false;                // abort: every request
  bool allow_unreachable = false;  // workers add: register a worker that does not answer yet
  std::string ids;
  int max_new_tokens = -1;
  double temperature = -1;
  double top_p = -1;
  int top_k = 0;
  int64_t seed = -1;
  bool logprobs = false;
  int top_logprobs_num = 0;
  int logprob_start_len = -1;
  bool logprobs_at_temperature_one = false;
  bool ignore_eos = false;
  int64_t min_weight_version = -1;         // generate: -1 unset
  int64_t exact_weight_version = -1;       // generate: -1 unset
  int max_version_lag = kUnsetVersionLag;  // generate: -1 no bound; others sent as given
  std::vector<std::string> stop;
  std::string mode;
  std::string from_disk;
  int64_t version = -1;
  bool abort_all = false;
  bool keep_pause = false;
  bool stage = false;         // complete-weights / receive-weights: stage instead of apply
  bool keep_kv = false;       // updates: in-flight update keeping the running requests' KV
  int drain_timeout_ms = -1;  // pause --mode drain: -1 the server's default
  bool no_flush = false;
  std::string action;
  std::string tokenizer;
  bool no_special = false;
  bool jsonl = false;  // tokenize: stdin lines are JSON strings
  bool skip_special = false;
  bool distributed = false;
  std::string group_name;
  std::string bucket_json;
  std::string master_address;
  int master_port = 0;
  int rank_offset = 1;
  int world_size = 0;
  std::string group_backend = "tcp";
  int group_timeout_ms = 60000;
  std::string arch;
  std::string size;
  std::string dtype;
  std::string out;
  std::string parent;           // publish-delta: the parent checkpoint folder
  int64_t parent_version = -1;  // publish / publish-delta / prepare / receive: -1 unset
  std::string manifest;         // prepare-weights / receive-weights: a delta's rl-manifest.json
};

}  // namespace rl::rlctl
