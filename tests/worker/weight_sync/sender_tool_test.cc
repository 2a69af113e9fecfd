// rl-weight-sender driven the way a test or trainer script drives it: read its stdout lines,
// join with receivers, issue one Receive per bucket line.
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "common/model_io/model_maker.h"
#include "common/model_io/safetensors.h"
#include "common/weight_sync/bucket_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/weight_sync/weight_sync.h"
#include "tests/testing/test_data.h"

namespace rl::weight_sync {
namespace {

class SenderToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    dir_ = tmp_.path();
    model_io::MakeModelOptions options;
    options.arch = "qwen3";
    options.size = "tiny";
    options.dtype = "bfloat16";
    options.out_dir = dir_;
    options.num_threads = 1;
    ASSERT_TRUE(model_io::MakeModel(options).ok());
    auto checkpoint = model_io::OpenCheckpoint(dir_);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = *std::move(checkpoint);
  }

  FILE* Start(const std::string& args) {
    const std::string command = std::string(RL_WEIGHT_SENDER_PATH) + " --checkpoint '" + dir_ +
                                "' --log-level warn " + args;
    FILE* out = popen(command.c_str(), "r");
    EXPECT_NE(out, nullptr) << command;
    return out;
  }

  static bool ReadLine(FILE* out, std::string* line) {
    line->clear();
    char buffer[1 << 16];
    while (std::fgets(buffer, sizeof(buffer), out) != nullptr) {
      line->append(buffer);
      if (!line->empty() && line->back() == '\n') {
        line->pop_back();
        return true;
      }
    }
    return !line->empty();
  }

  static int Finish(FILE* out) {
    int status = pclose(out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  const rl::testing::TempDir tmp_;
  std::string dir_;
  model_io::Checkpoint checkpoint_;
};

TEST_F(SenderToolTest, PlanOnlyCoversEveryTensorExactlyOnce) {
  FILE* out = Start("--plan-only --bucket-mb 0.05");
  std::map<std::string, int> seen;
  std::string line;
  int num_buckets = 0;
  while (ReadLine(out, &line)) {
    auto specs = ParseBucketJson(line);
    ASSERT_TRUE(specs.ok()) << specs.status();
    ASSERT_FALSE(specs->empty());
    int64_t bytes = 0;
    for (const TensorSpec& spec : *specs) {
      ++seen[spec.name];
      const model_io::TensorView* view = checkpoint_.Find(spec.name);
      ASSERT_NE(view, nullptr) << spec.name;
      EXPECT_EQ(spec.dtype, model_io::DTypeName(view->dtype));
      EXPECT_EQ(spec.shape, view->shape);
      bytes += *TensorBytes(spec);
    }
    EXPECT_TRUE(specs->size() == 1 || bytes <= int64_t{52428}) << line;
    EXPECT_TRUE(absl::StrContains(line, "\"bucket\":" + std::to_string(num_buckets))) << line;
    ++num_buckets;
  }
  EXPECT_EQ(Finish(out), 0);
  EXPECT_GT(num_buckets, 1);
  EXPECT_EQ(seen.size(), checkpoint_.tensors().size());
  for (const auto& [name, view] : checkpoint_.tensors()) {
    EXPECT_EQ(seen[name], 1) << name;
  }
}

TEST_F(SenderToolTest, BroadcastsTheCheckpointToTwoReceivers) {
  FILE* out = Start(
      "--listen 127.0.0.1:0 --world-size 3 --group-name tool --bucket-mb 0.1 "
      "--timeout-s 20");
  std::string line;
  ASSERT_TRUE(ReadLine(out, &line));
  ASSERT_TRUE(absl::StartsWith(line, "listening on 127.0.0.1:")) << line;
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(line.substr(std::strlen("listening on 127.0.0.1:")), &port));

  std::vector<std::unique_ptr<WeightReceiver>> receivers(2);
  std::vector<std::thread> joins;
  for (int r = 1; r <= 2; ++r) {
    joins.emplace_back([&, r] {
      GroupOptions o;
      o.master_address = "127.0.0.1";
      o.master_port = port;
      o.rank = r;
      o.world_size = 3;
      o.group_name = "tool";
      o.timeout = std::chrono::milliseconds(20000);
      auto receiver = ConnectReceiver(o);
      ASSERT_TRUE(receiver.ok()) << receiver.status();
      receivers[r - 1] = *std::move(receiver);
    });
  }
  for (auto& t : joins) t.join();
  ASSERT_TRUE(receivers[0] && receivers[1]);

  std::map<std::string, int> applied;
  std::mutex mu;
  bool done = false;
  while (ReadLine(out, &line)) {
    if (absl::StrContains(line, "\"done\":true")) {
      done = true;
      break;
    }
    auto specs = ParseBucketJson(line);
    ASSERT_TRUE(specs.ok()) << specs.status();
    // What a worker does per UpdateWeightsFromDistributed call.
    std::vector<std::thread> threads;
    for (auto& receiver : receivers) {
      threads.emplace_back([&, r = receiver.get()] {
        absl::Status st =
            r->Receive(*specs, [&](const TensorSpec& spec, absl::Span<const uint8_t> bytes) {
              const model_io::TensorView* view = checkpoint_.Find(spec.name);
              if (view == nullptr || view->data.size() != bytes.size() ||
                  std::memcmp(view->data.data(), bytes.data(), bytes.size()) != 0) {
                return absl::DataLossError("bytes differ for " + spec.name);
              }
              std::lock_guard<std::mutex> lock(mu);
              ++applied[spec.name];
              return absl::OkStatus();
            });
        EXPECT_TRUE(st.ok()) << st;
      });
    }
    for (auto& t : threads) t.join();
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(Finish(out), 0);
  EXPECT_EQ(applied.size(), checkpoint_.tensors().size());
  for (const auto& [name, count] : applied) EXPECT_EQ(count, 2) << name;
  // The tool closed the group: a further Receive says so.
  absl::Status after = receivers[0]->Receive(
      {}, [](const TensorSpec&, absl::Span<const uint8_t>) { return absl::OkStatus(); });
  EXPECT_TRUE(absl::IsFailedPrecondition(after)) << after;
}

TEST_F(SenderToolTest, BadFlagsExitWithUsageError) {
  FILE* out = Start("--listen nohostport --world-size 2 --group-name g");
  std::string line;
  while (ReadLine(out, &line)) {
  }
  EXPECT_EQ(Finish(out), 2);
  out = Start("--plan-only --bucket-mb 0");
  while (ReadLine(out, &line)) {
  }
  EXPECT_EQ(Finish(out), 2);
}

}  // namespace
}  // namespace rl::weight_sync
