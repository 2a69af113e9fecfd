#include "common/server_runner.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/server_interceptor.h"
#include "spdlog/spdlog.h"

namespace rl {

namespace {

// gRPC's callback handlers answer a request body that does not parse (garbage or truncated
// protobuf) with UNIMPLEMENTED and an empty message (grpcpp server_callback_handlers.h: a failed
// Deserialize makes RunHandler fall back to an "unimplemented" reactor), which blames the
// server for the client's bytes. This interceptor notices the failed parse (POST_RECV_MESSAGE
// with no message) and rewrites that status to INVALID_ARGUMENT with a message naming the
// method. Statuses our handlers send are never touched.
class BadMessageInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BadMessageInterceptor(std::string method) : method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      bad_message_ = true;
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        bad_message_) {
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
          status.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                               "request: the message body is not a valid " +
                                                   method_ +
                                                   " request (malformed or truncated protobuf)"));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool bad_message_ = false;
};

class BadMessageInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new BadMessageInterceptor(info->method() != nullptr ? info->method() : "");
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const ServerOptions& options, const std::vector<grpc::Service*>& services) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port: ", options.port, " is not in [0, 65535]"));
  }
  grpc::EnableDefaultHealthCheckService(true);
  // gRPC's built-in health service does not use generated protobuf classes, so nothing pulls
  // health.proto's descriptor into the generated pool and reflection lists
  // grpc.health.v1.Health without being able to resolve it ("Symbol not found" in grpcurl).
  // Touching the descriptor links and registers the file.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  std::unique_ptr<GrpcServer> s(new GrpcServer());
  s->host_ = options.host;
  s->drain_ = options.drain;
  const std::string want = JoinHostPort(options.host, options.port);
  builder.AddListeningPort(want, grpc::InsecureServerCredentials(), &s->port_);
  // gRPC sets SO_REUSEPORT by default: a second process started on a port in use would bind it
  // too and silently take a share of its connections. A port in use is an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<BadMessageInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(creators));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", want));
  }
  s->SetServing(true);
  return s;
}

GrpcServer::~GrpcServer() { Shutdown(); }

std::string JoinHostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

std::string GrpcServer::address() const { return JoinHostPort(host_, port_); }

void GrpcServer::SetServing(bool serving) { SetServiceServing("", serving); }

void GrpcServer::SetServiceServing(const std::string& service, bool serving) {
  if (server_ && server_->GetHealthCheckService() != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(service, serving);
  }
}

void GrpcServer::Shutdown() {
  if (shut_down_ || !server_) return;
  shut_down_ = true;
  // Every service, named ones included (the health service's all-services form).
  if (server_->GetHealthCheckService() != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
  }
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
