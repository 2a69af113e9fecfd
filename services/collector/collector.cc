#include "services/collector/collector.h"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/sha256.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "rl/v1/router.grpc.pb.h"
#include "services/collector/durable_file.h"
#include "services/collector/progress.h"
#include "services/collector/prompt_set.h"
#include "services/collector/shard.h"
#include "spdlog/spdlog.h"

namespace rl::collector {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr char kCheckpointName[] = "checkpoint.json";
constexpr char kMergedName[] = "trajectories.safetensors";
constexpr char kManifestName[] = "manifest.json";
constexpr size_t kMaxShardBytes = size_t{16} << 30;

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

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::chrono::milliseconds Jittered(std::chrono::milliseconds d) {
  thread_local absl::BitGen gen;
  return std::chrono::milliseconds(
      static_cast<int64_t>(static_cast<double>(d.count()) * absl::Uniform(gen, 0.75, 1.25)));
}

bool Retriable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
         code == grpc::StatusCode::ABORTED || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "ERROR";
  }
}

struct Task {
  const PromptRow* row;
  int32_t sample;
};

// A finished task as the writer receives it. `cancelled`: the run is stopping and the sample
// stays pending (not recorded).
struct Result {
  SampleRecord record;
  bool cancelled = false;
  bool exited = false;  // a dispatcher thread ended (wakes the writer)
  int retries = 0;
};

// Mutex + condition-variable queue from the dispatcher threads to the writer.
class ResultQueue {
 public:
  void Push(Result r) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(r));
    }
    cv_.notify_one();
  }
  // Waits until `deadline` for a result.
  std::optional<Result> PopUntil(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return !q_.empty(); })) return std::nullopt;
    Result r = std::move(q_.front());
    q_.pop_front();
    return r;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Result> q_;
};

class Dispatcher {
 public:
  Dispatcher(const CollectConfig& c, const std::atomic<bool>* stop) : c_(c), stop_(stop) {
    for (int i = 0; i < std::max(1, c.channels); ++i) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(512 << 20);
      args.SetMaxSendMessageSize(512 << 20);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt("rl.collector.channel", i);  // distinct args: one connection per channel
      // gRPC's own reconnect backoff (1 s growing to 120 s by default) would keep a channel in
      // TRANSIENT_FAILURE long after a restarted router is back, failing every retry at once;
      // reconnect at the collector's own retry cadence instead. (The minimum stays at gRPC's
      // default: it is also the connect timeout, and a short one fails every handshake on a
      // loaded machine.)
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::max(20, c.retry_backoff_ms));
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(20, c.max_backoff_ms));
      stubs_.push_back(rl::v1::Router::NewStub(
          grpc::CreateCustomChannel(c.router, grpc::InsecureChannelCredentials(), args)));
    }
  }

  bool Stopping() const { return stop_ != nullptr && stop_->load(); }

  // Cancels every call in flight (on stop: a long generation need not run to its end before
  // the collector can save and exit). Their samples stay pending for the next run.
  void CancelInFlight() {
    std::lock_guard<std::mutex> lock(mu_);
    for (grpc::ClientContext* ctx : in_flight_) ctx->TryCancel();
  }

  rl::v1::GenerateRequest BuildRequest(const Task& t, std::string* error) const {
    rl::v1::GenerateRequest req;
    if (t.row->has_text) {
      req.set_text(t.row->text);
    } else {
      req.mutable_input_ids()->mutable_ids()->Assign(t.row->input_ids.begin(),
                                                     t.row->input_ids.end());
    }
    rl::v1::SamplingParams* p = req.mutable_sampling_params();
    p->set_max_new_tokens(c_.max_new_tokens);
    p->set_temperature(static_cast<float>(c_.temperature));
    p->set_top_p(static_cast<float>(c_.top_p));
    if (c_.seed >= 0) p->set_seed(static_cast<uint64_t>(c_.seed));
    absl::Status s = ApplySamplingOverrides(t.row->sampling_json, p);
    if (!s.ok()) *error = std::string(s.message());
    if (p->has_seed()) p->set_seed(SampleSeed(p->seed(), t.row->index, t.sample));
    p->set_n(1);
    req.set_return_logprob(true);
    req.set_return_trajectory(true);
    if (c_.return_routed_experts) {
      req.set_return_routed_experts(true);
      req.set_return_expert_weights(true);
    }
    req.set_stream(false);
    req.set_request_id(absl::StrCat("collect-", t.row->index, "-", t.sample));
    return req;
  }

  Result Run(const Task& t, size_t slot) {
    Result res;
    SampleRecord& r = res.record;
    r.key = SampleKey{t.row->index, t.sample};
    r.group = t.row->group;
    r.metadata_json = t.row->metadata_json;
    std::string error;
    const rl::v1::GenerateRequest req = BuildRequest(t, &error);
    if (!error.empty()) {
      r.status = absl::StrCat("INVALID_ARGUMENT: ", error);
      return res;
    }
    rl::v1::Router::Stub* stub = stubs_[slot % stubs_.size()].get();
    auto backoff = std::chrono::milliseconds(c_.retry_backoff_ms);
    std::string last_error;
    for (int attempt = 1; attempt <= c_.max_attempts; ++attempt) {
      if (attempt > 1) {
        ++res.retries;
        // +-25% jitter: samples that failed together do not all retry in the same instant.
        const auto until = Clock::now() + Jittered(backoff);
        while (Clock::now() < until) {
          if (Stopping()) {
            res.cancelled = true;
            return res;
          }
          std::this_thread::sleep_for(
              std::min<Clock::duration>(std::chrono::milliseconds(20), until - Clock::now()));
        }
        backoff = std::min(backoff * 2, std::chrono::milliseconds(c_.max_backoff_ms));
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(c_.request_timeout_s));
      if (!c_.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + c_.api_key);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (Stopping()) {  // checked under the lock: CancelInFlight cannot miss this call
          res.cancelled = true;
          return res;
        }
        in_flight_.insert(&ctx);
      }
      auto reader = stub->Generate(&ctx, req);
      rl::v1::GenerateResponse msg;
      std::optional<rl::v1::GenerateFinal> final;
      while (reader->Read(&msg)) {
        if (msg.has_final()) final = std::move(*msg.mutable_final());
      }
      grpc::Status s = reader->Finish();
      {
        std::lock_guard<std::mutex> lock(mu_);
        in_flight_.erase(&ctx);
      }
      if (Stopping() && s.error_code() == grpc::StatusCode::CANCELLED) {
        res.cancelled = true;
        return res;
      }
      r.attempts = attempt;
      if (!s.ok()) {
        last_error = absl::StrCat(CodeName(s.error_code()), ": ", s.error_message());
        if (Retriable(s.error_code())) continue;
        r.status = last_error;
        return res;
      }
      if (!final) {
        last_error = "INTERNAL: the router's stream ended without a final message";
        continue;
      }
      if (final->finish_reason() == rl::v1::FINISH_REASON_ABORT) {
        last_error = absl::StrCat("ABORTED: ", final->abort_message());
        continue;
      }
      r.attempts = attempt - 1 + std::max(1, final->attempts());
      absl::Status fill = FillFromFinal(*final, &r);
      r.status = fill.ok() ? "ok" : absl::StrCat("INVALID_ARGUMENT: ", fill.message());
      return res;
    }
    if (Stopping()) {
      res.cancelled = true;
      return res;
    }
    r.status = absl::StrCat(last_error, " (after ", c_.max_attempts, " attempts)");
    return res;
  }

 private:
  const CollectConfig& c_;
  const std::atomic<bool>* stop_;
  std::vector<std::unique_ptr<rl::v1::Router::Stub>> stubs_;
  std::mutex mu_;
  absl::flat_hash_set<grpc::ClientContext*> in_flight_;
};

std::string ShardName(int64_t number) { return absl::StrFormat("shard_%05d.safetensors", number); }

int64_t NextShardNumber(const CollectCheckpoint& c) {
  int64_t next = 0;
  for (const std::string& s : c.shards) {
    int64_t v = 0;
    if (std::sscanf(s.c_str(), "shard_%ld.safetensors", &v) == 1) next = std::max(next, v + 1);
  }
  return next;
}

void RemoveStaleTemps(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".tmp") fs::remove(e.path(), ec);
  }
}

}  // namespace

uint64_t SampleSeed(uint64_t base, int64_t index, int32_t sample) {
  return SplitMix64(base ^ SplitMix64(static_cast<uint64_t>(index) ^
                                      SplitMix64(static_cast<uint64_t>(sample) + 1))) >>
         1;
}

absl::Status ValidateConfig(const CollectConfig& c) {
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError(m); };
  if (c.out.empty()) return bad("--out is required");
  if (!c.merge_only) {
    if (c.router.empty()) return bad("--router is required");
    if (c.prompts.empty()) return bad("--prompts is required");
  }
  if (c.n < 1 || c.n > kMaxSamplesPerPrompt) return bad("--n must be in [1, 1024]");
  if (c.concurrency < 1 || c.concurrency > 4096) return bad("--concurrency must be in [1, 4096]");
  if (c.save_batch_size < 1 || c.save_batch_size > 10'000'000) {
    return bad("--save-batch-size must be in [1, 10000000]");
  }
  if (c.max_new_tokens < 0) return bad("--max-new-tokens must be >= 0");
  if (!(c.temperature >= 0) || c.temperature > 100) return bad("--temperature must be in [0, 100]");
  if (!(c.top_p > 0) || c.top_p > 1) return bad("--top-p must be in (0, 1]");
  if (c.idle_flush_ms < 1) return bad("--idle-flush-ms must be >= 1");
  if (c.max_attempts < 1 || c.max_attempts > 100) return bad("--max-attempts must be in [1, 100]");
  if (c.retry_backoff_ms < 0 || c.max_backoff_ms < c.retry_backoff_ms) {
    return bad("--retry-backoff-ms must be >= 0 and <= --max-backoff-ms");
  }
  if (c.request_timeout_s < 1) return bad("--request-timeout-s must be >= 1");
  if (c.channels < 1 || c.channels > 64) return bad("--channels must be in [1, 64]");
  if (c.progress != "auto" && c.progress != "bar" && c.progress != "log" && c.progress != "off") {
    return bad("--progress must be auto, bar, log or off");
  }
  return absl::OkStatus();
}

absl::StatusOr<MergeSummary> MergeShards(const std::string& dir,
                                         const CollectCheckpoint& checkpoint) {
  std::map<SampleKey, SampleRecord> merged;
  for (const std::string& name : checkpoint.shards) {
    const std::string path = (fs::path(dir) / name).string();
    auto bytes = ReadFileBounded(path, kMaxShardBytes);
    if (!bytes.ok()) return bytes.status();
    auto records = DecodeShard(*bytes, path);
    if (!records.ok()) return records.status();
    for (SampleRecord& r : *records) {
      if (!checkpoint.completed.contains(r.key) && !checkpoint.failed.contains(r.key)) continue;
      merged[r.key] = std::move(r);  // later shards hold newer records
    }
  }
  std::vector<SampleRecord> records;
  records.reserve(merged.size());
  MergeSummary summary;
  for (auto& [key, r] : merged) {
    if (!r.ok()) ++summary.num_failed;
    summary.num_tokens += static_cast<int64_t>(r.tokens.size());
    records.push_back(std::move(r));
  }
  summary.num_samples = static_cast<int64_t>(records.size());
  const std::string bytes = EncodeShard(records);
  summary.path = (fs::path(dir) / kMergedName).string();
  if (absl::Status s = WriteFileDurably(summary.path, bytes); !s.ok()) return s;
  nlohmann::json manifest = {
      {"format", "rlfleet.collect.manifest.v1"},
      {"file", kMergedName},
      {"trajectory_format", kShardFormat},
      {"sha256", Sha256Hex(bytes)},
      {"bytes", bytes.size()},
      {"num_samples", summary.num_samples},
      {"num_failed", summary.num_failed},
      {"num_tokens", summary.num_tokens},
      {"n", checkpoint.n},
      {"total", checkpoint.total},
      {"complete", summary.num_samples == checkpoint.total && summary.num_failed == 0},
      {"prompts_sha256", checkpoint.prompts_sha256},
      {"shards", checkpoint.shards}};
  if (absl::Status s =
          WriteFileDurably((fs::path(dir) / kManifestName).string(), manifest.dump(2) + "\n");
      !s.ok()) {
    return s;
  }
  return summary;
}

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
        " samples, more than the limit of ", kMaxSamples,
        " per collection; split the prompt set"));
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

  int64_t next_shard = NextShardNumber(ckpt);
  std::vector<SampleRecord> buffer;
  auto flush = [&]() -> absl::Status {
    if (buffer.empty()) return absl::OkStatus();
    const std::string name = ShardName(next_shard);
    const std::string path = (fs::path(config.out) / name).string();
    RETURN_IF_ERROR(WriteFileDurably(path, EncodeShard(buffer)));
    if (config.jsonl) {
      RETURN_IF_ERROR(WriteFileDurably(
          (fs::path(config.out) / absl::StrFormat("shard_%05d.jsonl", next_shard)).string(),
          EncodeJsonl(buffer)));
    }
    ckpt.shards.push_back(name);
    for (const SampleRecord& r : buffer) {
      if (r.ok()) {
        ckpt.completed.insert(r.key);
        ckpt.failed.erase(r.key);
      } else {
        ckpt.failed.insert(r.key);
      }
    }
    RETURN_IF_ERROR(SaveCheckpoint(ckpt_path, ckpt));
    ++next_shard;
    ++summary.shards;
    spdlog::debug("rl-collect: wrote {} ({} samples)", name, buffer.size());
    buffer.clear();
    return absl::OkStatus();
  };

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
      buffer.push_back(std::move(rec));
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
        if (static_cast<int>(buffer.size()) >= config.save_batch_size) status = flush();
      } else if (!buffer.empty() && Clock::now() - last_result >= idle) {
        status = flush();
        last_result = Clock::now();
      }
      if (show) progress.Update(counts);
    }
    // A failed write stops the dispatchers; their results are lost and stay pending.
    if (!status.ok()) next.store(tasks.size());
    for (std::thread& t : threads) t.join();
    while (auto rest = queue.PopUntil(Clock::now())) {
      take(*rest);
      if (status.ok() && static_cast<int>(buffer.size()) >= config.save_batch_size) {
        status = flush();
      }
    }
    summary.interrupted = received < tasks.size();
    if (status.ok()) status = flush();
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
