// Keys from files and the environment reach the real processes; a key on the command line is
// scrubbed from /proc/PID/cmdline and warned about; a missing key file stops the process.
#include <chrono>
#include <string>
#include <thread>

#include "tests/reliability/bad_input_test_util.h"

namespace rl::testing {
namespace {

namespace fs = std::filesystem;
using grpc::StatusCode;

// Keys from files and the environment; a key on the command line is scrubbed and warned about.
TEST(KeySourcesTest, FilesEnvironmentAndCommandLine) {
  Process flagged("rl-worker", {"--model", Stories(), "--port", "0", "--kv-cache-gb", "0.02",
                                "--threads", "1", "--admin-api-key", "plain-cmdline-secret"});
  ASSERT_FALSE(StartServer(flagged).empty()) << flagged.Log();
  EXPECT_THAT(flagged.Cmdline(), ::testing::Not(::testing::HasSubstr("plain-cmdline-secret")));
  EXPECT_THAT(flagged.Log(), ::testing::HasSubstr("given on the command line"));
  EXPECT_THAT(flagged.Log(), ::testing::Not(::testing::HasSubstr("plain-cmdline-secret")));

  Process missing("rl-worker", {"--model", Stories(), "--admin-api-key-file", "/no/such/key"});
  for (int i = 0; i < 200 && missing.Alive(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(missing.Alive());
  EXPECT_NE(missing.exit_status(), 0);
  EXPECT_THAT(missing.Log(), ::testing::HasSubstr("--admin-api-key-file"));

  const std::string key_file = TempPath("router.key");
  WriteText(key_file, "router-file-key\n");
  Process router("rl-router",
                 {"--tokenizer", Stories(), "--port", "0", "--admin-api-key-file", key_file},
                 {{"RL_API_KEY", "router-env-key"}});
  const std::string addr = StartServer(router);
  ASSERT_FALSE(addr.empty()) << router.Log();
  auto stub =
      rl::v1::Router::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  rl::v1::WorkerListResponse resp;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer router-file-key");
    EXPECT_TRUE(stub->ListWorkers(&ctx, {}, &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer router-env-key");
    EXPECT_EQ(stub->ListWorkers(&ctx, {}, &resp).error_code(), StatusCode::PERMISSION_DENIED);
  }
  {
    rl::v1::RetrieveFromTextRequest req;
    req.set_text("hi");
    rl::v1::RetrieveFromTextResponse r;
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer router-env-key");
    EXPECT_TRUE(stub->RetrieveFromText(&ctx, req, &r).ok());
  }
}

}  // namespace
}  // namespace rl::testing
