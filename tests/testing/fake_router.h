// FakeRouter: an in-process rl.v1.Router whose Generate answers at once with a deterministic
// final (prompt tokens = the text's bytes or the ids; output token i = (sum of prompt tokens +
// i * 7 + seed) % 500), for the collector's tests and its overhead bench. Fault knobs make
// the first calls of each request id fail with UNAVAILABLE or end with an aborted final, a
// given text fail with INVALID_ARGUMENT or answer late, and finals carry two weight-version
// segments. Router.Abort by group_id is counted per group (the collector's over-sampling tests):
// a call of a `hold_texts` prompt is held until its group is aborted (then it ends
// FINISH_REASON_ABORT with the first half of its output, `abort_reply_ms` later) or, at the latest,
// `hold_ms` has passed (then it answers in full); an aborted group is remembered, so a held call
// that arrives after the abort ends at once too. The first `abort_fail_first` aborts of each group
// fail with `abort_fail_code` and abort nothing.
// Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "rl/v1/router.grpc.pb.h"

namespace rl::collector {

struct FakeRouterOptions {
  int num_output_tokens = 8;
  int unavailable_first = 0;  // per request id: this many UNAVAILABLE answers first
  int abort_first = 0;        // then this many aborted finals
  std::string invalid_text;   // a prompt text answered INVALID_ARGUMENT
  bool two_segments = false;  // finals with versions [v, v+1] split in the middle
  bool send_segments = true;  // false: an older router (weight_version only)
  int64_t weight_version = 0;
  std::string slow_text;  // a prompt text answered only after slow_ms
  int slow_ms = 0;
  std::vector<std::string> hold_texts;  // prompt texts held until their group's abort (or hold_ms)
  int hold_ms = 60000;
  int abort_reply_ms = 0;  // a held call ends this long after its group's abort
  int abort_fail_first = 0;
  grpc::StatusCode abort_fail_code = grpc::StatusCode::UNAVAILABLE;
};

struct HoldSignal;

class FakeRouter final : public rl::v1::Router::CallbackService {
 public:
  explicit FakeRouter(FakeRouterOptions options) : options_(std::move(options)) {}
  grpc::ServerWriteReactor<rl::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const rl::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx,
                                  const rl::v1::AbortRequest* request,
                                  rl::v1::AbortResponse* response) override;
  int64_t calls() const { return calls_.load(); }
  // Router.Abort calls by group id (failed ones included), and the groups Generate was called
  // for.
  absl::flat_hash_map<std::string, int> aborts() const;
  absl::flat_hash_set<std::string> generated_groups() const;
  // Calls of slow_text received so far, and the delay of the ones that arrive from now on.
  int64_t slow_calls() const { return slow_calls_.load(); }
  void SetSlowMs(int ms) { slow_ms_.store(ms); }

 private:
  FakeRouterOptions options_;
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> slow_calls_{0};
  std::atomic<int> slow_ms_{options_.slow_ms};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> seen_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> aborts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> generated_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> aborted_ ABSL_GUARDED_BY(mu_);
  // Held calls by group id: each one's abort signal.
  absl::flat_hash_map<std::string, std::vector<std::shared_ptr<HoldSignal>>> held_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace rl::collector
