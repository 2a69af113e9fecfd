#include "services/collector/dispatcher.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace rl::collector {
namespace {

using Clock = std::chrono::steady_clock;

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

}  // namespace

uint64_t SampleSeed(uint64_t base, int64_t index, int32_t sample) {
  return SplitMix64(base ^ SplitMix64(static_cast<uint64_t>(index) ^
                                      SplitMix64(static_cast<uint64_t>(sample) + 1))) >>
         1;
}

void ResultQueue::Push(Result r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(std::move(r));
  }
  cv_.notify_one();
}

std::optional<Result> ResultQueue::PopUntil(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return !q_.empty(); })) return std::nullopt;
  Result r = std::move(q_.front());
  q_.pop_front();
  return r;
}

Dispatcher::Dispatcher(const CollectConfig& c, const std::atomic<bool>* stop,
                       const std::atomic<bool>* drain, std::string run_tag)
    : c_(c), stop_(stop), drain_(drain), run_tag_(std::move(run_tag)) {
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

std::string Dispatcher::GroupId(int64_t index) const {
  return run_tag_.empty() ? absl::StrCat("collect-", index)
                          : absl::StrCat("collect-", run_tag_, "-", index);
}

grpc::Status Dispatcher::SendAbort(int64_t index) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!c_.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + c_.api_key);
  rl::v1::AbortRequest req;
  req.set_group_id(GroupId(index));
  rl::v1::AbortResponse resp;
  return stubs_[0]->Abort(&ctx, req, &resp);
}

int Dispatcher::AbortStartedGroups() {
  if (!Draining()) return 0;
  std::vector<int64_t> due;
  {
    absl::MutexLock lock(&mu_);
    const auto now = Clock::now();
    for (const auto& [index, calls] : group_calls_) {
      AbortState& a = aborts_[index];
      if (a.settled || calls.unsent > 0 || now < a.next_try) continue;
      due.push_back(index);
    }
  }
  for (int64_t index : due) {
    const grpc::Status s = SendAbort(index);
    const grpc::StatusCode code = s.error_code();
    const bool transport = code == grpc::StatusCode::UNAVAILABLE ||
                           code == grpc::StatusCode::DEADLINE_EXCEEDED ||
                           code == grpc::StatusCode::RESOURCE_EXHAUSTED;
    int attempts;
    {
      absl::MutexLock lock(&mu_);
      AbortState& a = aborts_[index];
      attempts = ++a.attempts;
      a.settled = s.ok() || !transport || attempts >= c_.max_attempts;
      if (!a.settled) {
        // retry_backoff_ms x 2^(attempts - 1), capped, jittered like the calls' retries.
        auto backoff = std::chrono::milliseconds(std::max(1, c_.retry_backoff_ms));
        for (int i = 1; i < attempts && backoff.count() < c_.max_backoff_ms; ++i) backoff *= 2;
        a.next_try =
            Clock::now() +
            Jittered(std::min(backoff, std::chrono::milliseconds(std::max(1, c_.max_backoff_ms))));
      }
    }
    if (!s.ok()) {
      const std::string next = !transport ? "not retried"
                               : attempts >= c_.max_attempts
                                   ? absl::StrCat("given up after ", attempts, " attempts")
                                   : "retried after a backoff";
      spdlog::warn("rl-collect: Router.Abort(group_id {}): {}: {} ({}; its calls run on)",
                   GroupId(index), CodeName(code), s.error_message(), next);
    }
  }
  return static_cast<int>(due.size());
}

void Dispatcher::EndCall(grpc::ClientContext* ctx, int64_t index) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(ctx);
  auto it = group_calls_.find(index);
  if (it != group_calls_.end() && --it->second.running == 0) group_calls_.erase(it);
}

void Dispatcher::CancelInFlight() {
  absl::MutexLock lock(&mu_);
  for (grpc::ClientContext* ctx : in_flight_) ctx->TryCancel();
}

rl::v1::GenerateRequest Dispatcher::BuildRequest(const Task& t, std::string* error) const {
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
  // Issue 32: the group's samples share a group id and a routing key (the row's own
  // "routing_key" when it has one).
  req.set_group_id(GroupId(t.row->index));
  req.set_routing_key(t.row->routing_key.empty() ? req.group_id() : t.row->routing_key);
  if (t.partial != nullptr) {
    // Issue 34: continue the earlier partial output within the original budget.
    rl::v1::ResumeFrom* rf = req.mutable_resume_from();
    rf->mutable_output_ids()->Assign(t.partial->output_ids.begin(), t.partial->output_ids.end());
    rf->mutable_output_logprobs()->Assign(t.partial->output_logprobs.begin(),
                                          t.partial->output_logprobs.end());
    for (const auto& [version, tokens] : t.partial->segments) {
      rl::v1::VersionSegment* seg = rf->add_weight_version_segments();
      seg->set_weight_version(version);
      seg->set_num_tokens(tokens);
    }
  }
  return req;
}

Result Dispatcher::Run(const Task& t, size_t slot) {
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
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(c_.request_timeout_s));
    if (!c_.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + c_.api_key);
    {
      absl::MutexLock lock(&mu_);
      // Checked under the lock: CancelInFlight cannot miss this call, and once draining
      // AbortStartedGroups knows every call that will ever start.
      if (Stopping()) {
        res.cancelled = true;
        return res;
      }
      in_flight_.insert(&ctx);
      GroupCalls& g = group_calls_[t.row->index];
      ++g.running;
      ++g.unsent;
    }
    // Returns once the request is written (a blocking client stream sends it first).
    auto reader = stub->Generate(&ctx, req);
    {
      absl::MutexLock lock(&mu_);
      --group_calls_[t.row->index].unsent;
    }
    rl::v1::GenerateResponse msg;
    std::optional<rl::v1::GenerateFinal> final;
    while (reader->Read(&msg)) {
      if (msg.has_final()) final = std::move(*msg.mutable_final());
    }
    grpc::Status s = reader->Finish();
    EndCall(&ctx, t.row->index);
    if (Stopping() && s.error_code() == grpc::StatusCode::CANCELLED) {
      res.cancelled = true;
      return res;
    }
    if (Draining() &&
        (!s.ok() || !final || final->finish_reason() == rl::v1::FINISH_REASON_ABORT)) {
      // The batch is complete and the router aborted this call: its output (if any) is kept
      // for the next run; a call aborted before any output stays pending as it was.
      if (final && final->output_ids_size() > 0) {
        PartialSample p;
        p.key = r.key;
        p.dispatch_version = final->dispatch_weight_version();
        p.output_ids.assign(final->output_ids().begin(), final->output_ids().end());
        for (const rl::v1::TokenLogprob& lp : final->output_logprobs()) {
          p.output_logprobs.push_back(lp.logprob());
        }
        for (const rl::v1::VersionSegment& seg : final->weight_version_segments()) {
          p.segments.emplace_back(seg.weight_version(), seg.num_tokens());
        }
        res.partial = std::move(p);
      } else {
        res.cancelled = true;
      }
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

}  // namespace rl::collector
