// GenerateHost: what the generation data plane (rl.v1.Worker's Generate / Abort / GetLoad and
// the SGLang scheduler service's Generate) needs from the process that hosts the engine. The
// services and their stream reactors depend on this interface only; EngineHost implements it
// and WorkerServer (the composition root) wires both, so the dependency runs one way.
#pragma once

#include <cstdint>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "common/auth.h"
#include "common/request_limits.h"
#include "common/tokenizer/tokenizer.h"
#include "services/worker/engine/engine.h"
#include "services/worker/engine/request.h"

namespace rl::worker {

class GenerateHost {
 public:
  virtual ~GenerateHost() = default;

  virtual engine::Engine& engine() = 0;
  // Null when the model folder has no tokenizer.json.
  virtual const tokenizer::Tokenizer* tokenizer() const = 0;
  // FAILED_PRECONDITION while the worker is asleep; otherwise Engine::Submit.
  virtual absl::Status Submit(engine::GenerateRequest request,
                              engine::RequestCallbacks callbacks) = 0;
  // A fresh server-assigned request id.
  virtual std::string NextRequestId() = 0;
  // The --max-* request limits, and the model's context length (bounds max_new_tokens).
  virtual const RequestLimits& limits() const = 0;
  virtual int64_t context_len() const = 0;
  virtual int64_t weight_version() const = 0;
  // The admin key check (Worker.Abort with abort_all needs it).
  virtual const BearerAuth& admin_auth() const = 0;
  // Counts a finished completion in the worker's metrics. Any thread.
  virtual void RecordFinished(const engine::GenerateResult& result) = 0;
  // Runs `task` off the engine thread, in submission order (see EngineHost).
  virtual void RunOnStreamThread(absl::AnyInvocable<void() &&> task) = 0;
};

}  // namespace rl::worker
