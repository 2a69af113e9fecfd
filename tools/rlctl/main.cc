// rlctl: command-line client for every data and admin call of a worker or the router, plus
// offline helpers (tokenize, detokenize, make-model). Human-readable output by default; with
// --json every command prints exactly one JSON object. Exit status 0 on success, 1 when the
// call failed, 2 for bad usage. Links client libraries only (protos, tokenizer, model files,
// bucket plans): no router or worker server code.
#include <iostream>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/flags.h"
#include "tools/rlctl/commands.h"

namespace {

constexpr char kCommands[] = R"(Commands:
  generate --text T | --ids 1,2,3 [--max-new-tokens N] [--temperature F] [--top-p F]
           [--top-k N] [--seed N] [--logprobs] [--stop S]... [--top-logprobs-num N]
           [--logprob-start-len N] [--logprobs-at-temperature-one] [--ignore-eos]
           [--min-weight-version N] [--exact-weight-version N] [--max-version-lag N]
           [--request-id ID]
  generate --resume-id ID [--logprobs] ...   (router: continue the partial sample of a request
                                    that ended abort or stale, within its original budget)
  retrieve --text T
  episode --episode-id ID [--remove] [--routed-experts [--expert-weights]]
                                   (router: the episode's turns and one sample per branch;
                                    R3: each branch's routed experts)
  abort --request-id ID | --all    (router: forwarded to the worker holding the request;
                                    --all needs the admin key)
  pause --mode abort|in_place|retract|drain [--drain-timeout-ms T]      continue      flush
  update-weights --from-disk DIR [--version N] [--abort-all] [--keep-pause] [--keep-kv]
                 [--no-flush]
  stage-weights --from-disk DIR [--version N]   (read while serving; one staged version)
  activate-weights [--version N] [--abort-all] [--keep-pause] [--keep-kv]   (swap + flush)
  drop-staged-weights
  refit --from-disk DIR [--version N] [--abort-all] [--keep-pause] [--keep-kv]   (router: stage on every
        live worker, activate on all or on none)
  push --from-disk DIR [--stage] [--version N]   (the folder's tensors over the tensor stream: a
        delta publication (weights.rldelta) as a delta of its parent, a checkpoint whole; both
        verified against their manifest; --stage: staged for activate-weights)
  update-weights --distributed --group-name G [--bucket-json LINE]   (else one bucket JSON line
                 per stdin line, as rl-weight-sender prints them)
  init-group --master-address A --master-port P --world-size N --group-name G [--rank-offset R]
             [--backend tcp|nccl] [--group-timeout-ms T]      destroy-group --group-name G
  prepare-weights --group-name G [--parent-version P] [--manifest FILE]
                  (bucket JSON lines on stdin, e.g. rl-weight-sender --plan-only)
  complete-weights --group-name G [--version N] [--abort-all] [--keep-pause] [--keep-kv]
                   [--stage]
  receive-weights --group-name G [--version N] [--abort-all] [--keep-pause] [--keep-kv]
                  [--stage] [--parent-version P] [--manifest FILE]
                  (buckets on stdin; --stage: received while serving, kept as the staged
                  version for activate-weights; a delta: bucket lines with encodings, as
                  rl-weight-sender --delta prints them, and the parent version (from the
                  lines, or --parent-version); --manifest: verified against it)
  weights-checker --action snapshot|reset_tensors|compare|checksum
  list-weights      model-info      server-info      metrics      health
  workers list | add ADDR [--allow-unreachable] | remove ADDR | enable ADDR | disable ADDR
    | resync ADDR... --from-disk DIR [--version N] | adopt ADDR [--from-disk DIR]
  tokenize --tokenizer DIR [--text T | --file PATH] [--no-special] [--jsonl]
           (offline; --file: the whole file as one text; neither: one text per stdin line,
           with --jsonl a JSON string per line)
  detokenize --tokenizer DIR [--ids 1,2,3] [--skip-special]  (offline; stdin JSON arrays)
  make-model --arch llama|qwen2|qwen3|qwen3_moe --size tiny|0.5b|1b|8b [--seed N] [--dtype D] --out DIR
  publish --from-disk DIR --version N [--parent-version P]   (offline: writes DIR/rl-manifest.json,
          the per-tensor SHA-256 manifest workers verify before they serve version N)
  publish-delta --parent DIR --from-disk DIR --version N [--parent-version P] --out DIR
          (offline: OUT/weights.rldelta + OUT/rl-manifest.json, version N as a delta of the
          parent; --parent-version when the parent folder has no manifest)
)";

}  // namespace

int main(int argc, char** argv) {
  rl::rlctl::Options o;
  rl::FlagSet flags("rlctl");
  flags.String("target", &o.target, "worker or router address HOST:PORT");
  flags.String("api-key", &o.api_key, "bearer key (or env RL_ADMIN_API_KEY)");
  std::string api_key_file;
  flags.String("api-key-file", &api_key_file,
               "file holding the bearer key (preferred: not visible in the process list)");
  flags.Bool("json", &o.json, "print exactly one JSON object");
  flags.Double("timeout", &o.timeout_s, "call deadline in seconds");
  flags.String("text", &o.text, "prompt text");
  flags.String("file", &o.file, "tokenize: read the whole file as one text");
  flags.String("ids", &o.ids, "comma-separated token ids");
  flags.String("request-id", &o.request_id,
               "abort: the request's id; generate: the id to give the request (resume it by id)");
  flags.String("resume-id", &o.resume_id,
               "generate (router): resume the partial sample the router keeps for this request "
               "id (ended abort or stale) within its original max_new_tokens");
  flags.Bool("all", &o.all, "abort: every in-flight request (admin key)");
  flags.Bool("allow-unreachable", &o.allow_unreachable,
             "workers add: register a worker that does not answer yet (listed DEAD until it "
             "does)");
  flags.String("episode-id", &o.episode_id, "episode: the agent episode's id");
  flags.Bool("remove", &o.remove, "episode: forget the episode once exported");
  flags.Bool("routed-experts", &o.routed_experts,
             "episode: each sample's routed experts (R3; every turn of the branch recorded with "
             "routing)");
  flags.Bool("expert-weights", &o.expert_weights,
             "episode: with --routed-experts, their routing weights too");
  flags.Int("max-new-tokens", &o.max_new_tokens,
            "generate: tokens to generate (-1: server default)");
  flags.Double("temperature", &o.temperature, "generate: temperature (-1: server default)");
  flags.Double("top-p", &o.top_p, "generate: nucleus mass (-1: server default)");
  flags.Int("top-k", &o.top_k, "generate: top-k (0 off)");
  flags.Int("seed", &o.seed, "generate / make-model: seed (-1: none)");
  flags.Bool("logprobs", &o.logprobs, "generate: return logprobs");
  flags.Int("top-logprobs-num", &o.top_logprobs_num,
            "generate: top alternatives per position (0-20; implies --logprobs)");
  flags.Int("logprob-start-len", &o.logprob_start_len,
            "generate: prompt logprobs from this position (-1 none; implies --logprobs)");
  flags.Bool("logprobs-at-temperature-one", &o.logprobs_at_temperature_one,
             "generate: logprobs at temperature 1 (implies --logprobs)");
  flags.Bool("ignore-eos", &o.ignore_eos, "generate: keep generating past EOS");
  flags.Int("min-weight-version", &o.min_weight_version,
            "generate: accept only weight versions >= N (-1: any)");
  flags.Int("exact-weight-version", &o.exact_weight_version,
            "generate: accept only weight version N (-1: any)");
  flags.StringList("stop", &o.stop, "generate: stop string (repeatable)");
  flags.String("mode", &o.mode, "pause: abort | in_place | retract | drain");
  flags.Int("drain-timeout-ms", &o.drain_timeout_ms,
            "pause --mode drain: how long the call waits for running requests to finish (-1: the "
            "server's default, 60000)");
  flags.Int("max-version-lag", &o.max_version_lag,
            "generate: end the request with finish reason stale once the weight version moved "
            "more than N past its dispatch version (-1: no bound; unset: the fleet's default)");
  flags.Bool("keep-kv", &o.keep_kv,
             "update-weights / activate-weights / refit / complete-weights / receive-weights: "
             "in-flight update, running requests keep their KV (no recompute)");
  flags.String("from-disk", &o.from_disk,
               "update-weights / stage-weights / refit / publish / publish-delta: model folder");
  flags.Int("version", &o.version,
            "update-weights / stage-weights / refit: new weight version (-1: current + 1); "
            "activate-weights: the staged version expected");
  flags.Bool("abort-all", &o.abort_all, "update-weights: abort active requests");
  flags.Bool("keep-pause", &o.keep_pause, "update-weights: stay paused afterwards");
  flags.Bool("stage", &o.stage,
             "complete-weights / receive-weights / push: stage the received tensors instead of "
             "applying them (activate-weights serves them)");
  flags.Bool("no-flush", &o.no_flush,
             "update-weights: send flush_cache=false (ignored: workers flush the prefix cache on "
             "every update, KV of the old weights is never reused)");
  flags.Bool("distributed", &o.distributed,
             "update-weights: metadata for buckets broadcast by the trainer");
  flags.String("group-name", &o.group_name, "weight update group name");
  flags.String("bucket-json", &o.bucket_json,
               "update-weights --distributed: one bucket's JSON line");
  flags.String("master-address", &o.master_address, "init-group: the trainer's (rank 0) address");
  flags.Int("master-port", &o.master_port, "init-group: the trainer's port");
  flags.Int("rank-offset", &o.rank_offset,
            "init-group: first worker rank (the router adds the worker index)");
  flags.Int("world-size", &o.world_size, "init-group: trainer + every worker rank");
  flags.String("backend", &o.group_backend, "init-group: tcp | nccl");
  flags.Int("group-timeout-ms", &o.group_timeout_ms, "init-group: give up after this long");
  flags.String("action", &o.action,
               "weights-checker: snapshot | reset_tensors | compare | checksum");
  flags.String("tokenizer", &o.tokenizer, "tokenize / detokenize: folder with tokenizer.json");
  flags.Bool("no-special", &o.no_special, "tokenize: leave out BOS/EOS of the post-processor");
  flags.Bool("jsonl", &o.jsonl,
             "tokenize: each stdin line is one JSON string (texts with newlines)");
  flags.Bool("skip-special", &o.skip_special, "detokenize: drop special tokens");
  flags.String("arch", &o.arch, "make-model: llama | qwen2 | qwen3 | qwen3_moe");
  flags.String("size", &o.size, "make-model: tiny | 0.5b | 1b | 8b");
  flags.String("dtype", &o.dtype, "make-model: float32 | bfloat16 | float16");
  flags.String("out", &o.out, "make-model / publish-delta: output folder");
  flags.String("parent", &o.parent, "publish-delta: the parent version's checkpoint folder");
  flags.Int("parent-version", &o.parent_version,
            "publish / publish-delta: the parent's version (-1: none, or the parent's manifest); "
            "prepare-weights / receive-weights: the receive is a delta of version P (-1: the "
            "bucket lines' parent_version, if any)");
  flags.String("manifest", &o.manifest,
               "prepare-weights / receive-weights: the new version's rl-manifest.json, verified "
               "before a delta is applied or staged");
  auto positional = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::cout << flags.Usage() << kCommands;
    return 0;
  }
  // --json may follow the flag that failed to parse: look for it in argv too.
  bool json = o.json;
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" || arg == "--json=true" || arg == "--json=1") json = true;
  }
  if (!positional.ok())
    return rl::rlctl::UsageError(json, std::string(positional.status().message()));
  if (positional->empty()) {
    if (!json) std::cerr << kCommands;
    return rl::rlctl::UsageError(json, "no command (see rlctl --help)");
  }
  o.text_set = flags.IsSet("text");
  rl::ScrubFlagValues(argc, argv, {"api-key"});
  if (api_key_file.empty()) {
    o.api_key = rl::ResolveApiKey(o.api_key, "RL_ADMIN_API_KEY");
  } else {
    absl::StatusOr<std::string> key =
        rl::ResolveApiKey({"api-key", o.api_key, api_key_file, "RL_ADMIN_API_KEY"});
    if (!key.ok()) return rl::rlctl::UsageError(json, std::string(key.status().message()));
    o.api_key = *std::move(key);
  }
  return rl::rlctl::Run(o, *positional);
}
