// A tiny HTTP endpoint (cpp-httplib) serving GET /metrics from a MetricsRegistry in Prometheus
// text format, and GET /healthz (process liveness). Runs its own listener thread; Stop() (or
// the destructor) closes it.
//
// Hostile or careless clients cannot starve it (the Helm chart's liveness probe uses /healthz)
// nor exhaust its file descriptors:
// - each request must arrive whole within `read_timeout` (a deadline for the request, not per
//   read: a slowloris trickling a byte a second is cut off), every write has `write_timeout`,
//   an idle keep-alive connection is closed after `keep_alive_timeout` and after
//   `keep_alive_max_requests` requests, request bodies are capped;
// - at most `max_connections` connections are open at once, each on its own thread (an elastic
//   pool: `min_threads` always ready, threads above it exit when idle). A connection accepted
//   beyond the cap closes the OLDEST open one, so a flood of slow or idle connections can never
//   keep a new request (a probe) waiting: it is served at once, and the flood only evicts itself.
//   Accepted connections waiting for a thread are bounded too (`max_pending`); past that the
//   listener stops accepting until one is taken (the rest wait in the kernel's accept queue of
//   `listen_backlog`, which holds no descriptor of this process; httplib's own backlog of 5
//   dropped the SYNs of a burst, a probe's included). Open descriptors: at most max_connections +
//   max_pending + 1 + the listener.
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
  int max_pending = 16;
  int listen_backlog = 1024;  // the kernel's accept queue (capped by net.core.somaxconn)
  size_t max_payload_bytes = 4096;
};

class ConnectionTable;

class MetricsHttpServer {
 public:
  // Binds host:port (port 0 picks a free one) and starts serving `registry`, which must
  // outlive the server. Errors when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& host, int port, const MetricsRegistry* registry,
      const HttpServerOptions& options = HttpServerOptions());
  ~MetricsHttpServer();
  int port() const { return port_; }
  // Connections open now (being served or waiting for a request), for tests and metrics.
  int open_connections() const;
  void Stop();

 private:
  MetricsHttpServer() = default;
  std::shared_ptr<ConnectionTable> connections_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace rl
