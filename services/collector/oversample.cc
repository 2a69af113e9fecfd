#include "services/collector/oversample.h"

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "services/collector/dispatcher.h"
#include "services/collector/durable_file.h"
#include "services/collector/shard_writer.h"
#include "spdlog/spdlog.h"

namespace rl::collector {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

constexpr size_t kMaxFilterOutputBytes = 4096;

// One submitted group as the writer sees it.
struct GroupState {
  const PromptRow* row = nullptr;
  int expected = 0;                    // samples to hear about this run (held ones included)
  std::vector<SampleRecord> done;      // finished (ok or failed)
  std::vector<PartialSample> aborted;  // aborted with output while draining
  int heard = 0;                       // results received (cancelled ones included)
  bool complete = false;               // every sample finished, group handled
};

std::string GroupJson(const GroupState& g, const std::string& group_id) {
  Json samples = Json::array();
  std::vector<const SampleRecord*> recs;
  for (const SampleRecord& r : g.done) recs.push_back(&r);
  std::sort(recs.begin(), recs.end(),
            [](const SampleRecord* a, const SampleRecord* b) { return a->key < b->key; });
  for (const SampleRecord* r : recs) {
    Json out_ids(std::vector<int32_t>(r->tokens.begin() + r->prompt_len, r->tokens.end()));
    samples.push_back({{"sample", r->key.sample},
                       {"finish_reason", r->finish_reason},
                       {"text", r->text},
                       {"output_ids", out_ids},
                       {"weight_version", r->weight_version}});
  }
  Json meta = Json::parse(g.row->metadata_json, nullptr, false);
  if (meta.is_discarded()) meta = Json::object();
  Json j = {
      {"index", g.row->index}, {"group_id", group_id}, {"metadata", meta}, {"samples", samples}};
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string ShellQuote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

}  // namespace

absl::StatusOr<bool> RunGroupFilter(const std::string& command, const std::string& group_json,
                                    const std::string& scratch_dir, int timeout_s) {
  const std::string input = (fs::path(scratch_dir) / ".group-filter-input.json").string();
  RETURN_IF_ERROR(WriteFileDurably(input, group_json));
  const std::string cmd = absl::StrCat("timeout -k 5 ", timeout_s, " sh -c ", ShellQuote(command),
                                       " < ", ShellQuote(input));
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--group-filter: cannot run '", command, "'"));
  }
  std::string out;
  char buf[512];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) {
    if (out.size() < kMaxFilterOutputBytes) out.append(buf, std::min(got, kMaxFilterOutputBytes));
  }
  const int rc = ::pclose(f);
  std::error_code ec;
  fs::remove(input, ec);
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 124) {
    return absl::DeadlineExceededError(absl::StrCat("--group-filter '", command,
                                                    "' answered nothing within ", timeout_s,
                                                    " s and was stopped"));
  }
  const absl::string_view said = absl::StripLeadingAsciiWhitespace(out);
  const std::string answer(said.substr(0, said.find_first_of(" \r\n\t")));
  if (rc != 0 || (answer != "keep" && answer != "drop")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--group-filter '", command, "' ",
        rc != 0 ? absl::StrCat("failed (status ", WIFEXITED(rc) ? WEXITSTATUS(rc) : rc, ")")
                : "answered neither keep nor drop",
        "; its output: '", absl::CHexEscape(out.substr(0, 200)), "'"));
  }
  return answer == "keep";
}

absl::Status RunBatch(const CollectConfig& config, const PromptSet& prompts,
                      CollectCheckpoint* ckpt, const std::string& ckpt_path,
                      const std::atomic<bool>* stop, CollectSummary* summary) {
  // Pending groups: not dropped, some sample not saved ok. Those with partials first.
  // A copy: the tasks point into it while ckpt->partials changes as groups are written.
  const std::vector<PartialSample> earlier = ckpt->partials;
  absl::flat_hash_map<int64_t, std::vector<const PartialSample*>> partials_of;
  for (const PartialSample& p : earlier) partials_of[p.key.index].push_back(&p);
  std::vector<const PromptRow*> pending;
  for (const PromptRow& row : prompts.rows) {
    if (ckpt->dropped.contains(SampleKey{row.index, 0})) continue;
    bool all = true;
    for (int32_t k = 0; k < config.n && all; ++k) {
      all = ckpt->completed.contains(SampleKey{row.index, k});
    }
    if (!all) pending.push_back(&row);
  }
  std::stable_partition(pending.begin(), pending.end(),
                        [&](const PromptRow* r) { return partials_of.contains(r->index); });
  const int64_t batch = config.batch_groups;
  const size_t num_pending = pending.size();
  const int64_t submit = std::min<int64_t>(
      static_cast<int64_t>(pending.size()),
      static_cast<int64_t>(std::ceil(config.over_sample * static_cast<double>(batch) - 1e-9)));
  pending.resize(static_cast<size_t>(submit));

  // The groups' tasks, in group order; samples kept whole from an earlier run need no call.
  std::map<int64_t, GroupState> groups;
  std::vector<Task> tasks;
  std::vector<SampleRecord> held;
  for (const PromptRow* row : pending) {
    GroupState& g = groups[row->index];
    g.row = row;
    absl::flat_hash_map<int32_t, const PartialSample*> by_sample;
    for (const PartialSample* p : partials_of[row->index]) by_sample[p->key.sample] = p;
    for (int32_t k = 0; k < config.n; ++k) {
      if (ckpt->completed.contains(SampleKey{row->index, k})) continue;
      ++g.expected;
      auto it = by_sample.find(k);
      if (it != by_sample.end() && it->second->record.has_value()) {
        held.push_back(*it->second->record);
        held.back().group = row->group;
        continue;
      }
      const PartialSample* p = it == by_sample.end() ? nullptr : it->second;
      if (p != nullptr) ++summary->resumed;
      tasks.push_back(Task{row, k, p});
    }
  }
  spdlog::info(
      "rl-collect: batch of {} groups: {} pending, submitting {} ({} samples to call, {} "
      "resumed, {} kept from the last run)",
      batch, num_pending, submit, tasks.size(), summary->resumed, held.size());

  ShardWriter writer(config.out, ckpt_path, config.jsonl, ckpt);
  std::atomic<bool> drain{false};
  uint64_t tag = absl::Uniform<uint64_t>(absl::BitGen());
  Dispatcher dispatcher(config, stop, &drain, absl::StrFormat("%016x", tag));
  ResultQueue queue;
  for (SampleRecord& r : held) queue.Push(Result{.record = std::move(r)});
  std::atomic<size_t> next{0};
  const int num_threads =
      static_cast<int>(std::min<size_t>(config.concurrency, std::max<size_t>(tasks.size(), 1)));
  std::atomic<int> alive{num_threads};
  std::vector<std::thread> threads;
  for (int i = 0; i < num_threads; ++i) {
    threads.emplace_back([&, i] {
      while (!dispatcher.Stopping()) {
        const size_t t = next.fetch_add(1);
        if (t >= tasks.size()) break;
        queue.Push(dispatcher.Run(tasks[t], static_cast<size_t>(i)));
      }
      alive.fetch_sub(1);
      queue.Push(Result{.exited = true});
    });
  }

  absl::Status status = absl::OkStatus();
  int64_t kept = 0;
  auto forget_partials = [&](int64_t index) {
    std::erase_if(ckpt->partials, [&](const PartialSample& p) { return p.key.index == index; });
  };
  auto group_done = [&](GroupState& g) -> absl::Status {
    g.complete = true;
    const bool all_ok =
        std::all_of(g.done.begin(), g.done.end(), [](const SampleRecord& r) { return r.ok(); });
    if (all_ok && !config.group_filter.empty()) {
      ASSIGN_OR_RETURN(bool keep,
                       RunGroupFilter(config.group_filter,
                                      GroupJson(g, dispatcher.GroupId(g.row->index)), config.out));
      if (!keep) {
        ckpt->dropped.insert(SampleKey{g.row->index, 0});
        forget_partials(g.row->index);
        ++summary->dropped_groups;
        return absl::OkStatus();
      }
    }
    for (SampleRecord& r : g.done) writer.Add(std::move(r));
    forget_partials(g.row->index);
    if (all_ok) ++kept;
    return absl::OkStatus();
  };
  auto take = [&](Result& r) -> absl::Status {
    if (r.exited) return absl::OkStatus();
    auto it = groups.find(r.record.key.index);
    if (it == groups.end()) return absl::OkStatus();
    GroupState& g = it->second;
    ++g.heard;
    if (r.cancelled) return absl::OkStatus();
    if (r.partial.has_value()) {
      g.aborted.push_back(*std::move(r.partial));
      return absl::OkStatus();
    }
    ++summary->this_run;
    if (!r.record.ok()) {
      spdlog::warn("rl-collect: sample index={} sample={} failed: {}", r.record.key.index,
                   r.record.key.sample, r.record.status);
    }
    g.done.push_back(std::move(r.record));
    if (static_cast<int>(g.done.size()) == g.expected && !g.complete && !drain.load()) {
      RETURN_IF_ERROR(group_done(g));
      if (kept >= batch) {
        drain.store(true);
        dispatcher.AbortStartedGroups();
      }
    }
    return absl::OkStatus();
  };

  const auto idle = std::chrono::milliseconds(config.idle_flush_ms);
  auto last_result = Clock::now();
  bool cancelled_in_flight = false;
  while (status.ok()) {
    if (stop != nullptr && stop->load() && !cancelled_in_flight) {
      dispatcher.CancelInFlight();
      cancelled_in_flight = true;
    }
    // Groups whose requests were still being written at the drain, and aborts to retry.
    if (drain.load() && !cancelled_in_flight) dispatcher.AbortStartedGroups();
    std::optional<Result> r =
        queue.PopUntil(std::min(Clock::now() + std::chrono::milliseconds(100), last_result + idle));
    if (r && r->exited) {
      if (alive.load() == 0) break;
      continue;
    }
    if (r) {
      last_result = Clock::now();
      status = take(*r);
      if (status.ok() && static_cast<int>(writer.buffered()) >= config.save_batch_size) {
        status = writer.Flush();
      }
    } else if (writer.buffered() > 0 && Clock::now() - last_result >= idle) {
      status = writer.Flush();
      last_result = Clock::now();
    }
  }
  if (!status.ok()) {
    next.store(tasks.size());
    drain.store(true);
    dispatcher.CancelInFlight();
  }
  for (std::thread& t : threads) t.join();
  while (auto rest = queue.PopUntil(Clock::now())) {
    if (status.ok()) status = take(*rest);
  }
  // Groups left unfinished: what they have is kept for the next run (replacing what it had
  // from before only where this run got further).
  for (auto& [index, g] : groups) {
    if (g.complete) continue;
    std::vector<PartialSample> keep;
    absl::flat_hash_map<int32_t, bool> have;
    for (SampleRecord& rec : g.done) {
      if (!rec.ok()) continue;  // a failed sample is simply collected again
      PartialSample p;
      p.key = rec.key;
      have[rec.key.sample] = true;
      p.record = std::move(rec);
      keep.push_back(std::move(p));
    }
    for (PartialSample& p : g.aborted) {
      have[p.key.sample] = true;
      keep.push_back(std::move(p));
    }
    for (const PartialSample& p : ckpt->partials) {
      if (p.key.index == index && !have.contains(p.key.sample)) keep.push_back(p);
    }
    if (!g.aborted.empty() || !g.done.empty()) ++summary->aborted_groups;
    forget_partials(index);
    summary->partials_saved += static_cast<int64_t>(keep.size());
    for (PartialSample& p : keep) ckpt->partials.push_back(std::move(p));
  }
  if (status.ok()) status = writer.Flush();
  if (status.ok()) status = SaveCheckpoint(ckpt_path, *ckpt);
  summary->shards = writer.shards_written();
  summary->kept_groups = kept;
  summary->interrupted = stop != nullptr && stop->load();
  return status;
}

}  // namespace rl::collector
