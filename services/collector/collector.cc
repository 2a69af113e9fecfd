#include "services/collector/collector.h"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "services/collector/dispatcher.h"
#include "services/collector/merge.h"
#include "services/collector/oversample.h"
#include "services/collector/progress.h"
#include "services/collector/prompt_set.h"
#include "services/collector/shard_writer.h"
#include "spdlog/spdlog.h"

namespace rl::collector {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kCheckpointName[] = "checkpoint.json";

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

}  // namespace

absl::StatusOr<CollectSummary> RunCollect(const CollectConfig& config,
                                          const std::atomic<bool>* stop) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  const auto start = Clock::now();
  const double cpu_start = CpuSeconds();
  const double writer_cpu_start = ThreadCpuSeconds();
  std::error_code ec;
  fs::create_directories(config.out, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create ", config.out, ": ", ec.message()));
  const std::string ckpt_path = (fs::path(config.out) / kCheckpointName).string();
  auto loaded = LoadCheckpoint(ckpt_path);
  if (!loaded.ok() && !absl::IsNotFound(loaded.status())) return loaded.status();
  CollectSummary summary;

  if (config.merge_only) {
    if (!loaded.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--merge: no checkpoint.json in ", config.out, " (nothing collected yet)"));
    }
    auto m = MergeShards(config.out, *loaded);
    if (!m.ok()) return m.status();
    summary.total = loaded->total;
    summary.done = m->num_samples;
    summary.failed = m->num_failed;
    summary.shards = static_cast<int64_t>(loaded->shards.size());
    summary.merged = true;
    return summary;
  }

  auto prompts = LoadPromptSet(config.prompts);
  if (!prompts.ok()) return prompts.status();
  const int64_t total = static_cast<int64_t>(prompts->rows.size()) * config.n;
  if (total > kMaxSamples) {
    return absl::InvalidArgumentError(absl::StrCat(
        config.prompts, ": ", prompts->rows.size(), " rows x --n ", config.n, " = ", total,
        " samples, more than the limit of ", kMaxSamples, " per collection; split the prompt set"));
  }
  CollectCheckpoint ckpt;
  if (loaded.ok()) {
    if (loaded->prompts_sha256 != prompts->sha256 || loaded->n != config.n ||
        loaded->total != total) {
      return absl::FailedPreconditionError(absl::StrCat(
          config.out, " holds a collection of another prompt set or --n (checkpoint n=", loaded->n,
          "); resume with the same --prompts and --n, or use a new --out"));
    }
    ckpt = std::move(*loaded);
  } else {
    ckpt.prompts_sha256 = prompts->sha256;
    ckpt.n = config.n;
    ckpt.total = total;
  }
  RemoveStaleTemps(config.out);
  summary.total = total;
  if (config.batch_groups > 0) {
    // Over-sampling batches (oversample.h).
    RETURN_IF_ERROR(RunBatch(config, *prompts, &ckpt, ckpt_path, stop, &summary));
    summary.failed = static_cast<int64_t>(ckpt.failed.size());
    summary.done = static_cast<int64_t>(ckpt.completed.size() + ckpt.failed.size());
    if (!summary.interrupted) {
      auto m = MergeShards(config.out, ckpt);
      if (!m.ok()) return m.status();
      summary.merged = true;
    }
    summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    summary.cpu_seconds = CpuSeconds() - cpu_start;
    summary.writer_cpu_seconds = ThreadCpuSeconds() - writer_cpu_start;
    return summary;
  }

  std::vector<Task> tasks;
  for (const PromptRow& row : prompts->rows) {
    for (int32_t k = 0; k < config.n; ++k) {
      if (!ckpt.completed.contains(SampleKey{row.index, k})) tasks.push_back(Task{&row, k});
    }
  }
  summary.total = total;
  const int64_t done_at_start = static_cast<int64_t>(ckpt.completed.size() + ckpt.failed.size());
  int64_t failed_known = static_cast<int64_t>(ckpt.failed.size());
  spdlog::info("rl-collect: {} samples, {} already saved, {} to collect", total, done_at_start,
               tasks.size());

  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const bool show = config.progress != "off";
  Progress progress(stderr, config.progress == "bar" || (config.progress == "auto" && tty),
                    done_at_start);
  ProgressCounts counts{done_at_start, total, failed_known, 0};

  ShardWriter writer(config.out, ckpt_path, config.jsonl, &ckpt);

  absl::Status status = absl::OkStatus();
  if (!tasks.empty()) {
    Dispatcher dispatcher(config, stop);
    ResultQueue queue;
    std::atomic<size_t> next{0};
    const int num_threads = static_cast<int>(std::min<size_t>(config.concurrency, tasks.size()));
    std::atomic<int> alive{num_threads};
    std::vector<std::thread> threads;
    for (int i = 0; i < num_threads; ++i) {
      threads.emplace_back([&, i] {
        while (!dispatcher.Stopping()) {
          const size_t t = next.fetch_add(1);
          if (t >= tasks.size()) break;
          queue.Push(dispatcher.Run(tasks[t], static_cast<size_t>(i)));
        }
        // Every result of this thread is queued before the count drops.
        alive.fetch_sub(1);
        queue.Push(Result{.exited = true});
      });
    }
    size_t received = 0;
    auto take = [&](Result& r) {
      counts.retries += r.retries;
      if (r.exited || r.cancelled) return;
      ++received;
      ++summary.this_run;
      SampleRecord& rec = r.record;
      const bool was_failed = ckpt.failed.contains(rec.key);
      if (!was_failed) ++counts.done;
      if (rec.ok() && was_failed) --counts.failed;
      if (!rec.ok() && !was_failed) ++counts.failed;
      if (!rec.ok()) {
        spdlog::warn("rl-collect: sample index={} sample={} failed: {}", rec.key.index,
                     rec.key.sample, rec.status);
      }
      writer.Add(std::move(rec));
    };
    auto last_result = Clock::now();
    bool cancelled_in_flight = false;
    const auto idle = std::chrono::milliseconds(config.idle_flush_ms);
    while (received < tasks.size() && status.ok()) {
      if (dispatcher.Stopping() && !cancelled_in_flight) {
        dispatcher.CancelInFlight();  // later calls see the stop under the lock and never start
        cancelled_in_flight = true;
      }
      const auto deadline =
          std::min(Clock::now() + std::chrono::milliseconds(100), last_result + idle);
      std::optional<Result> r = queue.PopUntil(deadline);
      if (r && r->exited) {
        if (alive.load() == 0) break;  // stopping: every remaining result is already queued
        continue;
      }
      if (r) {
        last_result = Clock::now();
        take(*r);
        if (static_cast<int>(writer.buffered()) >= config.save_batch_size) status = writer.Flush();
      } else if (writer.buffered() > 0 && Clock::now() - last_result >= idle) {
        status = writer.Flush();
        last_result = Clock::now();
      }
      if (show) progress.Update(counts);
    }
    // A failed write stops the dispatchers; their results are lost and stay pending.
    if (!status.ok()) next.store(tasks.size());
    for (std::thread& t : threads) t.join();
    while (auto rest = queue.PopUntil(Clock::now())) {
      take(*rest);
      if (status.ok() && static_cast<int>(writer.buffered()) >= config.save_batch_size) {
        status = writer.Flush();
      }
    }
    summary.interrupted = received < tasks.size();
    if (status.ok()) status = writer.Flush();
    summary.shards = writer.shards_written();
  } else if (!loaded.ok()) {
    status = SaveCheckpoint(ckpt_path, ckpt);
  }
  counts.failed = static_cast<int64_t>(ckpt.failed.size());
  counts.done = static_cast<int64_t>(ckpt.completed.size() + ckpt.failed.size());
  if (show) progress.Finish(counts);
  RETURN_IF_ERROR(status);

  summary.done = counts.done;
  summary.failed = counts.failed;
  summary.retries = counts.retries;
  if (!summary.interrupted) {
    auto m = MergeShards(config.out, ckpt);
    if (!m.ok()) return m.status();
    summary.merged = true;
  }
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  summary.cpu_seconds = CpuSeconds() - cpu_start;
  summary.writer_cpu_seconds = ThreadCpuSeconds() - writer_cpu_start;
  return summary;
}

}  // namespace rl::collector
