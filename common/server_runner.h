// gRPC server runner shared by rl-worker and rl-router: binds HOST:PORT (port 0 picks a free
// port; a port another process listens on is an error, never shared), registers the given
// services plus grpc.health.v1.Health and server reflection (so grpcurl works without .proto
// files), and drains gracefully on shutdown: new calls are refused, in-flight calls get `drain`
// to finish, then are cancelled.
//
// Health: the overall status (service "") is liveness: SERVING from start until Shutdown,
// whatever else the process does (a weight update, sleep, a drain). Readiness to take new work
// is a named service's status (SetServiceServing: "rl.v1.Worker" on rl-worker, "rl.v1.Router" on
// rl-router), which the process sets as its state changes. Shutdown sets every status
// NOT_SERVING.
//
// Signals: BlockTerminationSignals() first thing in main (before any thread starts) and
// WaitForTerminationSignal() when the process has nothing else to do; RunServerMain
// (common/server_main.h) does both.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"

namespace rl {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::chrono::milliseconds drain{10000};
  // Largest message accepted or sent (weight chunks can be large).
  int max_message_bytes = 512 << 20;
};

class GrpcServer {
 public:
  // `services` must outlive the server.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const ServerOptions& options, const std::vector<grpc::Service*>& services);
  ~GrpcServer();

  int port() const { return port_; }
  // "HOST:PORT" as bound.
  std::string address() const;
  // Overall health status ("" service, liveness) reported by grpc.health.v1.Health; named
  // services keep theirs.
  void SetServing(bool serving);
  // The status of one named service (readiness); a name never set answers NOT_FOUND.
  void SetServiceServing(const std::string& service, bool serving);
  // Graceful drain (idempotent).
  void Shutdown();
  grpc::Server* server() { return server_.get(); }

 private:
  GrpcServer() = default;
  std::unique_ptr<grpc::Server> server_;
  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds drain_{0};
  bool shut_down_ = false;
};

// "HOST:PORT", or "[HOST]:PORT" for an IPv6 host.
std::string JoinHostPort(const std::string& host, int port);

void BlockTerminationSignals();
// Blocks until SIGINT or SIGTERM arrives; returns the signal number.
int WaitForTerminationSignal();

}  // namespace rl
