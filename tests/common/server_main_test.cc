#include "common/server_main.h"

#include <signal.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/logging.h"
#include "gtest/gtest.h"

namespace rl {
namespace {

// argv for PrepareMain: owned, mutable strings (keys are scrubbed in place).
class Argv {
 public:
  explicit Argv(std::vector<std::string> args) : args_(std::move(args)) {
    for (std::string& a : args_) ptrs_.push_back(a.data());
    ptrs_.push_back(nullptr);
  }
  int argc() const { return static_cast<int>(args_.size()); }
  char** argv() { return ptrs_.data(); }
  const std::string& operator[](size_t i) const { return args_[i]; }

 private:
  std::vector<std::string> args_;
  std::vector<char*> ptrs_;
};

struct Config {
  int port = 0;
  std::string log_level = "info";
  std::string admin_key, admin_key_file, key, key_file;
};

// A binary's flag table as main.cc declares it.
struct Binary {
  Config config;
  FlagSet flags{"rl-test"};
  ServerKeyFlags keys{&config.admin_key, &config.admin_key_file, &config.key, &config.key_file};
  int validated = 0;
  absl::Status validate_result;

  Binary() {
    flags.Int("port", &config.port, "port");
    RegisterServerKeyFlags(flags, keys, "test calls");
  }
  MainOptions Options() {
    return MainOptions{.program = "rl-test",
                       .flags = &flags,
                       .log_level = &config.log_level,
                       .keys = keys,
                       .validate = [this] {
                         ++validated;
                         return validate_result;
                       }};
  }
};

TEST(PrepareMain, ParsesLogsResolvesKeysAndValidates) {
  Binary b;
  Argv args({"rl-test", "--port", "7", "--log-level", "warn", "--admin-api-key", "s3cret"});
  EXPECT_EQ(PrepareMain(args.argc(), args.argv(), b.Options()), std::nullopt);
  EXPECT_EQ(b.config.port, 7);
  EXPECT_EQ(b.config.log_level, "warn");
  EXPECT_EQ(spdlog::get_level(), spdlog::level::warn);
  EXPECT_EQ(b.config.admin_key, "s3cret");
  EXPECT_EQ(args[6], "******");  // scrubbed from argv (ps, /proc/PID/cmdline)
  EXPECT_EQ(b.validated, 1);
  ASSERT_TRUE(InitLogging("info").ok());
}

TEST(PrepareMain, HelpExitsZeroBadFlagTwo) {
  Binary help;
  Argv h({"rl-test", "--help"});
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(PrepareMain(h.argc(), h.argv(), help.Options()), 0);
  const std::string usage = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(usage.find("--log-level"), std::string::npos) << usage;  // registered by PrepareMain
  EXPECT_EQ(help.validated, 0);

  Binary bad;
  Argv b({"rl-test", "--bogus"});
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(PrepareMain(b.argc(), b.argv(), bad.Options()), 2);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("rl-test: "), std::string::npos);
  EXPECT_EQ(bad.validated, 0);
}

TEST(PrepareMain, EachFailureIsOneLineAndExitTwo) {
  {
    Binary b;
    Argv args({"rl-test", "--log-level", "loud"});
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(PrepareMain(args.argc(), args.argv(), b.Options()), 2);
    EXPECT_EQ(::testing::internal::GetCapturedStderr().rfind("rl-test: ", 0), 0u);
    EXPECT_EQ(b.validated, 0);
  }
  {
    Binary b;
    Argv args({"rl-test", "--admin-api-key-file", "/nonexistent/key"});
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(PrepareMain(args.argc(), args.argv(), b.Options()), 2);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("admin-api-key-file"), std::string::npos) << err;
    EXPECT_EQ(b.validated, 0);
  }
  {
    Binary b;
    b.validate_result = absl::InvalidArgumentError("--port must be > 0");
    Argv args({"rl-test"});
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(PrepareMain(args.argc(), args.argv(), b.Options()), 2);
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "rl-test: --port must be > 0\n");
  }
}

TEST(AnnounceListening, OneFlushedLineWithAnOptionalLabel) {
  ::testing::internal::CaptureStdout();
  AnnounceListening("127.0.0.1:5");
  AnnounceListening("127.0.0.1:6", "sglang");
  EXPECT_EQ(::testing::internal::GetCapturedStdout(),
            "listening on 127.0.0.1:5\nsglang listening on 127.0.0.1:6\n");
}

TEST(JoinHostPort, BracketsIpv6) {
  EXPECT_EQ(JoinHostPort("127.0.0.1", 50051), "127.0.0.1:50051");
  EXPECT_EQ(JoinHostPort("::1", 7), "[::1]:7");
}

// What RunServerMain needs of a server; Shutdown says so on stderr (the death test's output).
class FakeServer {
 public:
  std::string address() const { return "127.0.0.1:4242"; }
  void Shutdown() { std::fprintf(stderr, "fake server drained\n"); }
};

int ServeUntilSignal() {
  static Binary b;
  static Argv args({"rl-test"});
  return RunServerMain(
      args.argc(), args.argv(), b.Options(),
      []() -> absl::StatusOr<std::unique_ptr<FakeServer>> {
        // Started after the signals were blocked: the signal waits for sigwait.
        std::thread([] { kill(getpid(), SIGTERM); }).detach();
        return std::make_unique<FakeServer>();
      },
      [](FakeServer& server) { std::fprintf(stderr, "ready at %s\n", server.address().c_str()); });
}

int FailToStart() {
  static Binary b;
  static Argv args({"rl-test"});
  return RunServerMain(args.argc(), args.argv(), b.Options(),
                       []() -> absl::StatusOr<std::unique_ptr<FakeServer>> {
                         return absl::UnavailableError("cannot listen on 127.0.0.1:1");
                       });
}

TEST(RunServerMainDeathTest, ServesUntilSigtermThenDrainsAndExitsZero) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(ServeUntilSignal()), ::testing::ExitedWithCode(0),
              "ready at 127.0.0.1:4242.*fake server drained");
}

TEST(RunServerMainDeathTest, StartFailureExitsOne) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(FailToStart()), ::testing::ExitedWithCode(1),
              "rl-test: cannot listen on 127.0.0.1:1");
}

TEST(StopOnTerminationSignalDeathTest, FirstSignalStopsSecondExits130) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const std::atomic<bool>* stop = StopOnTerminationSignal();
        if (stop->load()) std::exit(1);
        raise(SIGINT);
        if (!stop->load()) std::exit(2);
        std::fprintf(stderr, "stopping\n");
        raise(SIGTERM);
        std::exit(3);
      },
      ::testing::ExitedWithCode(130), "stopping");
}

}  // namespace
}  // namespace rl
