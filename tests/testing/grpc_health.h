// grpc.health.v1 from a test: the status a server reports for one service ("" = the overall
// status, liveness; a name such as "rl.v1.Worker" = that service's, readiness), as the probe
// of a kubelet or the router would ask it. Header-only; links rl_proto.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace rl::testing {

// "SERVING", "NOT_SERVING", ... or "error <code>: <message>" when the call fails (NOT_FOUND for a
// service never set, UNAVAILABLE for a server gone).
inline std::string HealthStatus(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) {
    return "error " + std::to_string(s.error_code()) + ": " + s.error_message();
  }
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
}

inline std::string HealthStatus(const std::string& address, const std::string& service) {
  return HealthStatus(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()), service);
}

}  // namespace rl::testing
