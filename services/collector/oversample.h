// rl-collect's batch runs with over-sampling (issue 34; --batch-groups, --over-sample,
// --group-filter), after slime's over-sampling rollout and partial-rollout recycling.
//
// A group is a prompt row with its --n samples. A run collects one batch of `batch_groups`
// groups: it submits the first ceil(over_sample x batch_groups) pending groups (those with
// partial samples from an earlier run first, then in file order); a group that completes with
// every sample ok is shown to the filter (a shell command reading the group as JSON on stdin
// and printing keep or drop) and, kept, written whole to the shards; once batch_groups groups
// are kept, no call starts, the groups with calls in flight are aborted through the router
// (Router.Abort by group_id, once per group; a group never sent is never aborted), and their
// samples are saved in checkpoint.json's `partials`: an aborted sample's earlier output with
// its dispatch version, resumed by the next run within its budget (ResumeFrom by tokens), and
// a finished sample of an unfinished group kept whole. A dropped group is recorded as such and
// never collected again; a group with a failed sample is written (its failed samples are
// retried by a later run) and does not count toward the batch. A run that kept its batch, or
// found nothing more to submit, merges everything saved so far.
//
// Threads as in collector.h: `concurrency` dispatcher threads, the calling thread writes.
// Cost: the filter runs once per completed group, in the writer thread (a process per group);
// at the batch, one Router.Abort per group with a call in flight (at most `concurrency`).
#pragma once

#include <atomic>
#include <string>

#include "absl/status/statusor.h"
#include "services/collector/checkpoint.h"
#include "services/collector/collect_config.h"
#include "services/collector/collector.h"
#include "services/collector/prompt_set.h"

namespace rl::collector {

// One batch run (config.batch_groups > 0) over `prompts` from checkpoint `ckpt` (saved to
// `ckpt_path`); fills `summary`'s counts.
absl::Status RunBatch(const CollectConfig& config, const PromptSet& prompts,
                      CollectCheckpoint* ckpt, const std::string& ckpt_path,
                      const std::atomic<bool>* stop, CollectSummary* summary);

// Runs `command` (sh -c) with `group_json` on its stdin: true for "keep", false for "drop"
// (its first word of output); anything else, or a failed command, is INVALID_ARGUMENT naming
// the command and what it said. `scratch_dir` holds the input file while it runs. A command
// still running after `timeout_s` is killed (coreutils `timeout`: TERM, then KILL 5 s later)
// and is DEADLINE_EXCEEDED: a hung filter never stalls the run.
inline constexpr int kGroupFilterTimeoutS = 60;
absl::StatusOr<bool> RunGroupFilter(const std::string& command, const std::string& group_json,
                                    const std::string& scratch_dir,
                                    int timeout_s = kGroupFilterTimeoutS);

}  // namespace rl::collector
