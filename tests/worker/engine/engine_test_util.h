// Helpers for engine tests: a result collector with blocking waits, request builders and a
// gate helper that pauses the engine while the fake runner holds it between steps.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "services/worker/engine/engine.h"
#include "tests/testing/fake_runner.h"

namespace rl::engine::testing {

// Upper bound for waiting on results: only a hang guard (a leak or a deadlock), never a speed
// assertion.
inline constexpr absl::Duration kHangGuard = absl::Seconds(120);

inline std::string Key(const std::string& id, int32_t index) {
  return index == 0 ? id : absl::StrCat(id, "#", index);
}

class Collector {
 public:
  RequestCallbacks Callbacks() {
    RequestCallbacks cb;
    cb.on_output = [this](const OutputChunk& c) {
      absl::MutexLock lock(&mu_);
      auto& s = streamed_[Key(c.id, c.index)];
      s.insert(s.end(), c.token_ids.begin(), c.token_ids.end());
    };
    cb.on_finish = [this](GenerateResult r) {
      absl::MutexLock lock(&mu_);
      const std::string k = Key(r.id, r.index);
      ++finish_calls_[k];
      results_[k] = std::move(r);
    };
    return cb;
  }

  // Waits until `n` completions finished in total; false on the hang guard.
  bool WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return results_.size() >= n; };
    const absl::Time deadline = absl::Now() + kHangGuard;
    while (!done()) {
      if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) return done();
    }
    return true;
  }
  // Waits until completion `key` streamed at least `n` tokens (or finished).
  bool WaitForTokens(const std::string& key, size_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return streamed_[key].size() >= n || results_.count(key) > 0;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&done), absl::Now() + kHangGuard);
  }

  size_t num_finished() {
    absl::MutexLock lock(&mu_);
    return results_.size();
  }
  GenerateResult result(const std::string& key) {
    absl::MutexLock lock(&mu_);
    return results_.at(key);
  }
  std::vector<int32_t> streamed(const std::string& key) {
    absl::MutexLock lock(&mu_);
    return streamed_[key];
  }
  std::map<std::string, GenerateResult> results() {
    absl::MutexLock lock(&mu_);
    return results_;
  }
  int finish_calls(const std::string& key) {
    absl::MutexLock lock(&mu_);
    return finish_calls_[key];
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, GenerateResult> results_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<int32_t>> streamed_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> finish_calls_ ABSL_GUARDED_BY(mu_);
};

inline GenerateRequest Greedy(const std::string& id, std::vector<int32_t> prompt,
                              int32_t max_new_tokens) {
  GenerateRequest r;
  r.id = id;
  r.input_ids = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_new_tokens = max_new_tokens;
  return r;
}

// A prompt of `len` tokens in [3, vocab) derived from `seed` (never EOS = 2).
inline std::vector<int32_t> Prompt(int32_t len, uint64_t seed, int64_t vocab = 64) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) {
    p.push_back(3 + static_cast<int32_t>(FakeMix(seed, i) % static_cast<uint64_t>(vocab - 3)));
  }
  return p;
}

struct FakeEngine {
  std::unique_ptr<Engine> engine;
  FakeRunner* runner = nullptr;  // owned by the engine
  FakeRunnerOptions options;
};

inline FakeEngine MakeFakeEngine(FakeRunnerOptions fo = {}, EngineOptions eo = {},
                                 std::unique_ptr<TextDecoder> decoder = nullptr) {
  eo.check_invariants = true;
  auto runner = std::make_unique<FakeRunner>(fo);
  FakeEngine fe;
  fe.runner = runner.get();
  fe.options = fo;
  auto engine = Engine::Create(std::move(runner), eo, std::move(decoder));
  EXPECT_TRUE(engine.ok()) << engine.status();
  fe.engine = std::move(engine).value();
  return fe;
}

inline absl::Status CheckInvariants(Engine& engine) {
  return engine.RunOnEngineThread([](EngineContext& ctx) { return ctx.CheckInvariants(); });
}

// Wraps a real runner with the same step gate as FakeRunner (SetStepBudget / AllowSteps /
// WaitForSteps), so tests can hold the engine between known steps.
class GatedRunner : public model::ModelRunner {
 public:
  explicit GatedRunner(std::unique_ptr<model::ModelRunner> inner) : inner_(std::move(inner)) {}
  const model_io::ModelConfig& config() const override { return inner_->config(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  int64_t num_kv_slots() const override { return inner_->num_kv_slots(); }
  int32_t page_size() const override { return inner_->page_size(); }
  absl::Status Forward(const model::ForwardInput& in, model::ForwardOutput* out) override {
    {
      absl::MutexLock lock(&mu_);
      while (budget_ == 0) cv_.Wait(&mu_);
      if (budget_ > 0) --budget_;
    }
    absl::Status s = inner_->Forward(in, out);
    absl::MutexLock lock(&mu_);
    ++steps_done_;
    cv_.SignalAll();
    return s;
  }
  absl::Status UpdateWeight(const model::TensorInfo& info,
                            absl::Span<const uint8_t> bytes) override {
    return inner_->UpdateWeight(info, bytes);
  }
  void SetStepBudget(int64_t k) {
    absl::MutexLock lock(&mu_);
    budget_ = k;
    cv_.SignalAll();
  }
  void AllowSteps(int64_t k) {
    absl::MutexLock lock(&mu_);
    if (budget_ >= 0) budget_ += k;
    cv_.SignalAll();
  }
  void WaitForSteps(int64_t n) {
    absl::MutexLock lock(&mu_);
    while (steps_done_ < n) cv_.Wait(&mu_);
  }

 private:
  std::unique_ptr<model::ModelRunner> inner_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  int64_t budget_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t steps_done_ ABSL_GUARDED_BY(mu_) = 0;
};

// Pauses `engine` while `runner` gates it: releases one forward step at a time (one every
// 10 ms) until the pause was applied, so requests advance only a few steps past the call. Steps
// are released only once the pausing thread is in the call: on a loaded machine that thread can
// start hundreds of milliseconds late, and releasing a step every few milliseconds meanwhile let
// the requests run to their end before the pause.
template <typename Runner>
absl::Status PauseGated(Engine& engine, Runner& runner, PauseMode mode) {
  std::atomic<bool> calling{false};
  auto pause = std::async(std::launch::async, [&] {
    calling.store(true);
    return engine.Pause(mode);
  });
  while (pause.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
    if (calling.load()) runner.AllowSteps(1);
  }
  return pause.get();
}

// Asserts the pool is whole again once nothing runs: free + cached == total, no rows used.
inline void ExpectNoLeak(Engine& engine) {
  ASSERT_TRUE(CheckInvariants(engine).ok()) << CheckInvariants(engine);
  const ServerInfo info = engine.GetServerInfo();
  EXPECT_EQ(info.scheduler.num_running, 0);
  EXPECT_EQ(info.scheduler.num_waiting, 0);
  EXPECT_EQ(info.scheduler.req_to_token_used, 0);
  EXPECT_EQ(info.scheduler.available_kv_tokens + info.scheduler.tree_cache_tokens,
            info.scheduler.total_kv_tokens);
  EXPECT_EQ(info.scheduler.evictable_kv_tokens, info.scheduler.tree_cache_tokens);
  EXPECT_EQ(info.invariant_error, "");
}

}  // namespace rl::engine::testing
