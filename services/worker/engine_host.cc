#include "services/worker/engine_host.h"

#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"

namespace rl::worker {

EngineHost::EngineHost(Deps deps)
    : deps_(std::move(deps)),
      stream_executor_(std::make_unique<BoundedExecutor>("rl-stream", 1, kMaxStreamTasks)) {}

EngineHost::~EngineHost() { StopStreamThread(); }

void EngineHost::StopStreamThread() { stream_executor_.reset(); }

absl::Status EngineHost::Submit(engine::GenerateRequest request,
                                engine::RequestCallbacks callbacks) {
  RETURN_IF_ERROR(deps_.control->CheckAdmission());
  return deps_.engine->Submit(std::move(request), std::move(callbacks));
}

std::string EngineHost::NextRequestId() { return NewServerRequestId(); }

void EngineHost::RecordFinished(const engine::GenerateResult& result) {
  deps_.metrics->RecordFinished(result);
}

void EngineHost::RunOnStreamThread(absl::AnyInvocable<void() &&> task) {
  if (stream_executor_ == nullptr) {  // stopped (see StopStreamThread)
    std::move(task)();
    return;
  }
  // Submit moves from `task` only when it accepts it.
  while (!stream_executor_->Submit(std::move(task))) absl::SleepFor(absl::Microseconds(100));
}

}  // namespace rl::worker
