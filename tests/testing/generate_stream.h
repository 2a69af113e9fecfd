// One Generate stream (Router or Worker: `StubT` is either stub) read on its own thread, for the
// async-RL tests (drain, staleness, resume): tokens kept as chunks arrive, the final and the
// status kept; every wait is bounded (a hang guard, not a timing).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "rl/v1/generate.pb.h"

namespace rl::testing {

template <typename StubT>
class GenerateStream {
 public:
  GenerateStream(StubT* stub, rl::v1::GenerateRequest req) {
    thread_ = std::thread([this, stub, req = std::move(req)] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(90));
      auto reader = stub->Generate(&ctx, req);
      rl::v1::GenerateResponse msg;
      while (reader->Read(&msg)) {
        absl::MutexLock lock(&mu_);
        if (msg.has_chunk()) {
          tokens_.insert(tokens_.end(), msg.chunk().token_ids().begin(),
                         msg.chunk().token_ids().end());
        }
        if (msg.has_final()) final_ = msg.final();
      }
      grpc::Status s = reader->Finish();
      absl::MutexLock lock(&mu_);
      status_ = s;
      done_ = true;
    });
  }
  ~GenerateStream() { thread_.join(); }
  // Waits until `n` tokens streamed (or the call ended).
  bool WaitTokens(size_t n) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return tokens_.size() >= n || done_; };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(60)) && tokens_.size() >= n;
  }
  // Waits for the end of the call; its status.
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
  std::vector<int32_t> tokens() {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);
  rl::v1::GenerateFinal final_ ABSL_GUARDED_BY(mu_);
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rl::testing
