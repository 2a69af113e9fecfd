// The shared main() of the fleet's binaries, so that rl-worker, rl-router, rl-collect and
// rl-weight-sender parse flags, log, read their keys, report errors and exit the same way.
//
//   PrepareMain    flags (--help: the usage, exit 0; a bad flag: "<program>: <error>", exit 2)
//                  → logging (--log-level, registered here) → the server keys (file,
//                  environment or flag; scrubbed from argv) → the config's own check. Every
//                  failure is one line "<program>: <message>" on stderr and exit status 2.
//   RunServerMain  signals blocked (before any thread starts) → PrepareMain → start (failure:
//                  "<program>: <message>", exit 1) → `listening on HOST:PORT` on stdout → waits
//                  for SIGINT / SIGTERM → Drain (when the server has one: readiness off, new
//                  work refused, what runs finishes within a grace period) → Shutdown → exit 0.
//
// A job (rl-collect) runs PrepareMain and StopOnTerminationSignal instead of RunServerMain.
// Cost: nothing after start-up.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/auth.h"
#include "common/flags.h"
#include "common/server_runner.h"

namespace rl {

// What a binary's main.cc hands to PrepareMain / RunServerMain.
struct MainOptions {
  std::string program;               // "rl-worker": the prefix of every error line
  FlagSet* flags = nullptr;          // the binary's flag table (declared by main.cc)
  std::string* log_level = nullptr;  // --log-level is added to `flags` here, bound to this
  // A server's keys (their flags registered by main.cc with RegisterServerKeyFlags); resolved
  // in place after parsing. Unset: the binary has none.
  std::optional<ServerKeyFlags> keys;
  // The config struct's own check, after parsing and logging; may be empty.
  std::function<absl::Status()> validate;
};

// Parses argv into the flags' targets, starts logging, resolves the keys and validates. Returns
// the exit status when main must return now (0 after --help, 2 on any error, already reported
// on stdout / stderr), nullopt when the program goes on.
std::optional<int> PrepareMain(int argc, char** argv, const MainOptions& options);

// The one line a server prints on stdout, flushed, when it accepts calls: `listening on ADDR`
// (tests and scripts wait for it), or `LABEL listening on ADDR` for a second port.
void AnnounceListening(const std::string& address, const std::string& label = "");

// For jobs: installs SIGINT and SIGTERM handlers. The first signal sets the returned flag (the
// job stops cleanly and saves its work); a second one exits at once with status 130.
const std::atomic<bool>* StopOnTerminationSignal();

namespace internal {
// The first lines of a server's main: Abseil's debug-only deadlock detection off, SIGINT /
// SIGTERM blocked (they are taken with WaitForTerminationSignal), SIGPIPE ignored.
void BeginServerMain();
// Prints "<program>: <message>" on stderr and returns exit status 1.
int StartFailed(const std::string& program, const absl::Status& status);
}  // namespace internal

// The whole main() of a server. `start` runs after PrepareMain and returns
// absl::StatusOr<std::unique_ptr<Server>> of any Server with `std::string address()` and
// `void Shutdown()` (WorkerServer, RouterServer), and optionally `Drain()`, run on the signal
// before Shutdown; `ready(Server&)`, when given, runs right after the `listening on` line (more
// lines, a log line). Returns the process's exit status.
template <typename StartFn, typename ReadyFn>
int RunServerMain(int argc, char** argv, const MainOptions& options, StartFn start, ReadyFn ready) {
  internal::BeginServerMain();
  if (std::optional<int> exit_code = PrepareMain(argc, argv, options)) return *exit_code;
  auto server = start();
  if (!server.ok()) return internal::StartFailed(options.program, server.status());
  AnnounceListening((*server)->address());
  ready(**server);
  WaitForTerminationSignal();
  if constexpr (requires { (*server)->Drain(); }) (void)(*server)->Drain();
  (*server)->Shutdown();
  return 0;
}

template <typename StartFn>
int RunServerMain(int argc, char** argv, const MainOptions& options, StartFn start) {
  return RunServerMain(argc, argv, options, std::move(start), [](auto&) {});
}

}  // namespace rl
