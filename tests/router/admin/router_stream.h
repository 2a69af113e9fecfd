// One Router.Generate stream read on its own thread, for the router's async-RL tests (drain,
// staleness, resume): tokens counted as chunks arrive, the final and the status kept; every
// wait is bounded (a hang guard, not a timing).
#pragma once

#include <chrono>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "rl/v1/router.grpc.pb.h"

namespace rl::router::testing {

class Stream {
 public:
  Stream(rl::v1::Router::Stub* stub, rl::v1::GenerateRequest req) {
    thread_ = std::thread([this, stub, req = std::move(req)] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(90));
      auto reader = stub->Generate(&ctx, req);
      rl::v1::GenerateResponse msg;
      while (reader->Read(&msg)) {
        absl::MutexLock lock(&mu_);
        if (msg.has_chunk()) num_tokens_ += msg.chunk().token_ids_size();
        if (msg.has_final()) final_ = msg.final();
      }
      grpc::Status s = reader->Finish();
      absl::MutexLock lock(&mu_);
      status_ = s;
      done_ = true;
    });
  }
  ~Stream() { thread_.join(); }
  bool WaitTokens(int n) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return num_tokens_ >= n || done_; };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(60)) && num_tokens_ >= n;
  }
  grpc::Status Wait() {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(120));
    return done_ ? status_ : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "hung");
  }
  bool done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  rl::v1::GenerateFinal final_msg() {
    absl::MutexLock lock(&mu_);
    return final_;
  }

 private:
  absl::Mutex mu_;
  int num_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  rl::v1::GenerateFinal final_ ABSL_GUARDED_BY(mu_);
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rl::router::testing
