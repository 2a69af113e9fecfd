#include "common/server_main.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/synchronization/mutex.h"
#include "common/logging.h"

namespace rl {
namespace {

std::atomic<bool> g_stop{false};

void OnStopSignal(int) {
  if (g_stop.exchange(true)) std::_Exit(130);
}

int Fail(const std::string& program, const absl::Status& status, int exit_code) {
  std::cerr << program << ": " << status.message() << "\n";
  return exit_code;
}

}  // namespace

std::optional<int> PrepareMain(int argc, char** argv, const MainOptions& options) {
  options.flags->String("log-level", options.log_level, "trace|debug|info|warn|error|off");
  if (std::optional<int> exit_code = options.flags->ParseMain(argc, argv)) return exit_code;
  if (absl::Status s = InitLogging(*options.log_level); !s.ok()) return Fail(options.program, s, 2);
  if (options.keys.has_value()) {
    if (absl::Status s = ResolveServerKeys(argc, argv, *options.keys); !s.ok()) {
      return Fail(options.program, s, 2);
    }
  }
  if (options.validate) {
    if (absl::Status s = options.validate(); !s.ok()) return Fail(options.program, s, 2);
  }
  return std::nullopt;
}

void AnnounceListening(const std::string& address, const std::string& label) {
  std::printf("%s%slistening on %s\n", label.c_str(), label.empty() ? "" : " ", address.c_str());
  std::fflush(stdout);
}

const std::atomic<bool>* StopOnTerminationSignal() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return &g_stop;
}

namespace internal {

void BeginServerMain() {
  // Debian builds Abseil without NDEBUG, which leaves its debug-only lock-order (deadlock)
  // detection on: a graph update on every first lock and every destruction of a mutex (gRPC's
  // included), ~8% of the router's CPU at 10k streams. Tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  BlockTerminationSignals();
}

int StartFailed(const std::string& program, const absl::Status& status) {
  return Fail(program, status, 1);
}

}  // namespace internal
}  // namespace rl
