#include "common/server_runner.h"

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"

namespace rl {
namespace {

TEST(GrpcServer, BindsPortZeroAndReportsHealth) {
  auto server = GrpcServer::Start(ServerOptions{}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string((*server)->port()));
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  EXPECT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5)));
  (*server)->Shutdown();
  (*server)->Shutdown();  // idempotent
}

TEST(GrpcServer, RejectsBadPort) {
  ServerOptions options;
  options.port = 70000;
  auto server = GrpcServer::Start(options, {});
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rl
