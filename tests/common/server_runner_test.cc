#include "common/server_runner.h"

#include "google/protobuf/descriptor.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/testing/grpc_health.h"

namespace rl {
namespace {

TEST(GrpcServer, BindsPortZeroAndReportsHealth) {
  auto server = GrpcServer::Start(ServerOptions{}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string((*server)->port()));
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  EXPECT_TRUE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5)));
  (*server)->Shutdown();
  (*server)->Shutdown();  // idempotent
}

// A port in use is refused, not shared (gRPC's default SO_REUSEPORT would let a second server
// bind it and take a share of the first one's connections).
TEST(GrpcServer, RefusesAPortInUse) {
  auto first = GrpcServer::Start(ServerOptions{}, {});
  ASSERT_TRUE(first.ok()) << first.status();
  ServerOptions same;
  same.port = (*first)->port();
  auto second = GrpcServer::Start(same, {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(
      second.status().message().find("cannot listen on 127.0.0.1:" + std::to_string(same.port)),
      std::string::npos)
      << second.status();
  // Once the first is gone, the port is free again (a restart at the same address).
  (*first)->Shutdown();
  first->reset();
  auto again = GrpcServer::Start(same, {});
  EXPECT_TRUE(again.ok()) << again.status();
}

// Liveness (overall) and readiness (a named service) are separate statuses: a named service
// going NOT_SERVING leaves the overall SERVING and the reverse; Shutdown turns both off.
TEST(GrpcServer, OverallAndNamedHealthAreIndependent) {
  auto server = GrpcServer::Start(ServerOptions{}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string addr = (*server)->address();
  const auto HealthOf = [](const std::string& a, const std::string& service) {
    return rl::testing::HealthStatus(a, service);
  };
  EXPECT_EQ(HealthOf(addr, ""), "SERVING");
  EXPECT_EQ(HealthOf(addr, "rl.v1.Worker").rfind("error 5", 0), 0u);  // NOT_FOUND until set
  (*server)->SetServiceServing("rl.v1.Worker", true);
  EXPECT_EQ(HealthOf(addr, "rl.v1.Worker"), "SERVING");
  (*server)->SetServiceServing("rl.v1.Worker", false);
  EXPECT_EQ(HealthOf(addr, "rl.v1.Worker"), "NOT_SERVING");
  EXPECT_EQ(HealthOf(addr, ""), "SERVING");
  (*server)->SetServing(false);
  (*server)->SetServiceServing("rl.v1.Worker", true);
  EXPECT_EQ(HealthOf(addr, ""), "NOT_SERVING");
  EXPECT_EQ(HealthOf(addr, "rl.v1.Worker"), "SERVING");
  (*server)->SetServing(true);
  EXPECT_EQ(HealthOf(addr, ""), "SERVING");
}

TEST(GrpcServer, RejectsBadPort) {
  ServerOptions options;
  options.port = 70000;
  auto server = GrpcServer::Start(options, {});
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

// Reflection answers from the generated descriptor pool: health.proto must be in it, or grpcurl
// lists grpc.health.v1.Health but cannot resolve it.
TEST(GrpcServer, HealthDescriptorIsInTheGeneratedPool) {
  auto server = GrpcServer::Start(ServerOptions{}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  const google::protobuf::ServiceDescriptor* health =
      pool->FindServiceByName("grpc.health.v1.Health");
  ASSERT_NE(health, nullptr);
  EXPECT_NE(health->FindMethodByName("Check"), nullptr);
  EXPECT_NE(health->FindMethodByName("Watch"), nullptr);
}

}  // namespace
}  // namespace rl
