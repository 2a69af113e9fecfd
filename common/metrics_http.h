// A tiny HTTP endpoint (cpp-httplib) serving GET /metrics from a MetricsRegistry in Prometheus
// text format, and GET /healthz (process liveness). Runs its own listener thread; Stop() (or
// the destructor) closes it.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}

namespace rl {

class MetricsHttpServer {
 public:
  // Binds host:port (port 0 picks a free one) and starts serving `registry`, which must
  // outlive the server. Errors when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host,
                                                                  int port,
                                                                  const MetricsRegistry* registry);
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
