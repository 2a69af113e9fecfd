// A tiny HTTP endpoint (cpp-httplib) serving GET /metrics from a MetricsRegistry in Prometheus
// text format, and GET /healthz (process liveness). Runs its own listener thread; Stop() (or
// the destructor) closes it.
//
// Hostile or careless clients cannot starve it (the Helm chart's liveness probe uses /healthz):
// every read and write has a short timeout, an idle keep-alive connection is closed after
// `keep_alive_timeout` and after `keep_alive_max_requests` requests, request bodies are capped,
// and connections are served by an elastic pool: `min_threads` always ready, one more thread per
// concurrent connection up to `max_connections`, so a handful of slow (slowloris) or idle
// connections each hold one thread while new requests still find a free one. Connections beyond
// the cap wait in the accept queue. Threads above `min_threads` exit when idle.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}

namespace rl {

struct HttpServerOptions {
  std::chrono::milliseconds read_timeout{2000};
  std::chrono::milliseconds write_timeout{2000};
  std::chrono::seconds keep_alive_timeout{2};
  int keep_alive_max_requests = 16;
  int min_threads = 2;
  int max_connections = 128;
  size_t max_payload_bytes = 4096;
};

class MetricsHttpServer {
 public:
  // Binds host:port (port 0 picks a free one) and starts serving `registry`, which must
  // outlive the server. Errors when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& host, int port, const MetricsRegistry* registry,
      const HttpServerOptions& options = HttpServerOptions());
  ~MetricsHttpServer();
  int port() const { return port_; }
  void Stop();

 private:
  MetricsHttpServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace rl
