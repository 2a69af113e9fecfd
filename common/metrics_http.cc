#include "common/metrics_http.h"

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace rl {

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, const MetricsRegistry* registry) {
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->server_ = std::make_unique<httplib::Server>();
  s->server_->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->RenderPrometheus(), "text/plain; version=0.0.4");
  });
  s->server_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  const int bound = port == 0 ? s->server_->bind_to_any_port(host)
                              : (s->server_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot bind ", host, ":", port));
  }
  s->port_ = bound;
  httplib::Server* raw = s->server_.get();
  s->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace rl
