// rlctl's commands, one file per family; each turns Options into one RPC (or an offline action)
// and prints the result, human-readable or as exactly one JSON object, and returns the exit
// status. commands.cc dispatches by name.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/rlctl/client.h"
#include "tools/rlctl/options.h"

namespace rl::rlctl {

// Runs the command named by args[0] (further args are its operands); returns the exit status.
int Run(const Options& options, const std::vector<std::string>& args);

// Reports a command-line error before any command ran (unknown flag, no command): one JSON
// object on stdout with `json`, else a line on stderr. Returns 2.
int UsageError(bool json, const std::string& message);

// data_commands.cc: the data plane, through a router (or a worker, which answers Router calls
// UNIMPLEMENTED: generate and abort then use rl.v1.Worker).
int Generate(const Options& o, const Client& c);
int Retrieve(const Options& o, const Client& c);
int Episode(const Options& o, const Client& c);  // Router.GetEpisode
int Abort(const Options& o, const Client& c);
int Health(const Options& o, const Client& c);
int Metrics(const Options& o, const Client& c);

// admin_commands.cc: rl.v1.Admin calls of one shape (pause, continue, flush, sleep / wake,
// updates from disk, the weights checker, model / server info, list-weights).
int Pause(const Options& o, const Client& c);
int Continue(const Options& o, const Client& c);
int Flush(const Options& o, const Client& c);
int ReleaseMemory(const Options& o, const Client& c);
int ResumeMemory(const Options& o, const Client& c);
int UpdateWeights(const Options& o, const Client& c);  // --distributed: UpdateWeightsDistributed
// Staged refits (issue 30): stage, activate, drop on a worker or through the router; refit is the
// router's transactional stage-everywhere-then-activate.
int StageWeights(const Options& o, const Client& c);
int ActivateWeights(const Options& o, const Client& c);
int DropStagedWeights(const Options& o, const Client& c);
int RefitWeights(const Options& o, const Client& c);
int WeightsChecker(const Options& o, const Client& c);
int ModelInfo(const Options& o, const Client& c);
int ServerInfo(const Options& o, const Client& c);
int ListWeights(const Options& o, const Client& c);

// weight_group_commands.cc: distributed updates (the trainer broadcasts the bytes, rlctl sends
// the metadata): group init / destroy, one call per bucket, the two-phase receive.
int UpdateWeightsDistributed(const Options& o, const Client& c);
int InitGroup(const Options& o, const Client& c);
int DestroyGroup(const Options& o, const Client& c);
int PrepareWeights(const Options& o, const Client& c);
int CompleteWeights(const Options& o, const Client& c);
int ReceiveWeights(const Options& o, const Client& c);

// push_command.cc: a checkpoint folder (dense, with its manifest when it has one) or a delta
// publication (weights.rldelta: a delta stream naming its parent) pushed over
// UpdateWeightsFromTensor, applied or, with --stage, staged (issue 30).
int Push(const Options& o, const Client& c);

// worker_commands.cc: the router's worker pool (`workers
// list|add|remove|enable|disable|resync|adopt`).
int Workers(const Options& o, const Client& c, const std::vector<std::string>& args);

// offline_commands.cc: no server involved.
// tokenize: with --text prints the ids of the text (a JSON array, or {"ids": [...]} with
// --json); without --text reads stdin (one text per line, with --jsonl one JSON string per line)
// and prints one JSON array of ids per line.
absl::Status Tokenize(const Options& o);
// detokenize: with --ids prints the text; without, reads one JSON array of ids per stdin line
// and prints the text of each (JSON strings with --json).
absl::Status Detokenize(const Options& o);
// make-model: a random-weight model folder (config.json, safetensors, tokenizer.json).
int MakeModel(const Options& o);
// publish: writes the manifest of a checkpoint folder; publish-delta: a delta publication
// (docs/weight-publications.md).
int Publish(const Options& o);
int PublishDelta(const Options& o);

}  // namespace rl::rlctl
