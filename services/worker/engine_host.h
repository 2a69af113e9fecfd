// EngineHost: the GenerateHost (generate_host.h) of the engine in this process: what the data
// plane's services and stream reactors use. It admits requests only when the control plane
// does (WorkerControl::CheckAdmission: not asleep), assigns server request ids, counts finished
// completions in the metrics, and runs the stream thread.
// Design: the stream thread is a one-thread BoundedExecutor, so a stream's tasks run in
// submission order; when kMaxStreamTasks are queued the engine thread waits for room
// (backpressure, never an unbounded queue).
// Cost: one thread; a queued task per chunk or final until the stream thread runs it.
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "common/auth.h"
#include "common/bounded_executor.h"
#include "common/request_limits.h"
#include "common/tokenizer/tokenizer.h"
#include "services/worker/control/worker_control.h"
#include "services/worker/engine/engine.h"
#include "services/worker/generate_host.h"
#include "services/worker/worker_metrics.h"

namespace rl::worker {

class EngineHost final : public GenerateHost {
 public:
  struct Deps {
    engine::Engine* engine = nullptr;                 // outlives the host's last call
    const tokenizer::Tokenizer* tokenizer = nullptr;  // null: no tokenizer.json
    RequestLimits limits;
    int64_t context_len = 0;
    const BearerAuth* admin_auth = nullptr;
    WorkerMetrics* metrics = nullptr;
    const WorkerControl* control = nullptr;
  };
  static constexpr size_t kMaxStreamTasks = 1 << 16;

  explicit EngineHost(Deps deps);
  // StopStreamThread().
  ~EngineHost() override;

  // Runs every queued stream task, then joins the stream thread; a task handed over after that
  // (none is expected: call it once nothing submits and the engine has delivered its finals)
  // runs inline. Idempotent.
  void StopStreamThread();

  engine::Engine& engine() override { return *deps_.engine; }
  const tokenizer::Tokenizer* tokenizer() const override { return deps_.tokenizer; }
  // The control plane's admission check, then Engine::Submit.
  absl::Status Submit(engine::GenerateRequest request, engine::RequestCallbacks callbacks) override;
  // "srv-" + 128 random bits: unguessable, and in a namespace client ids cannot use.
  std::string NextRequestId() override;
  const RequestLimits& limits() const override { return deps_.limits; }
  int64_t context_len() const override { return deps_.context_len; }
  int64_t weight_version() const override { return deps_.engine->weight_version(); }
  const BearerAuth& admin_auth() const override { return *deps_.admin_auth; }
  void RecordFinished(const engine::GenerateResult& result) override;
  void RunOnStreamThread(absl::AnyInvocable<void() &&> task) override;

 private:
  const Deps deps_;
  std::unique_ptr<BoundedExecutor> stream_executor_;
};

}  // namespace rl::worker
