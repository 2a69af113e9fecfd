#include "common/server_runner.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "spdlog/spdlog.h"

namespace rl {

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const ServerOptions& options, const std::vector<grpc::Service*>& services) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port: ", options.port, " is not in [0, 65535]"));
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  std::unique_ptr<GrpcServer> s(new GrpcServer());
  s->host_ = options.host;
  s->drain_ = options.drain;
  const std::string want = options.host.find(':') != std::string::npos
                               ? absl::StrCat("[", options.host, "]:", options.port)
                               : absl::StrCat(options.host, ":", options.port);
  builder.AddListeningPort(want, grpc::InsecureServerCredentials(), &s->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (grpc::Service* service : services) builder.RegisterService(service);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", want));
  }
  s->SetServing(true);
  return s;
}

GrpcServer::~GrpcServer() { Shutdown(); }

std::string GrpcServer::address() const {
  return host_.find(':') != std::string::npos ? absl::StrCat("[", host_, "]:", port_)
                                               : absl::StrCat(host_, ":", port_);
}

void GrpcServer::SetServing(bool serving) {
  if (server_ && server_->GetHealthCheckService() != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(serving);
  }
}

void GrpcServer::Shutdown() {
  if (shut_down_ || !server_) return;
  shut_down_ = true;
  SetServing(false);
  server_->Shutdown(std::chrono::system_clock::now() + drain_);
  server_->Wait();
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int WaitForTerminationSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("received signal {}, draining", sig);
  return sig;
}

}  // namespace rl
