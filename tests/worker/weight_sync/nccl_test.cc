// nccl backend: one sender and one receiver on two GPUs of this machine (NCCL refuses two
// ranks on one device). Skips cleanly where the build has no NCCL or fewer than two devices.
#include <cstring>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "services/worker/weight_sync/weight_sync.h"
#include "spdlog/spdlog.h"

namespace rl::weight_sync {
namespace {

TEST(NcclTransportTest, BucketsArriveIntactAcrossTwoGpus) {
  if (!NcclBackendBuilt()) GTEST_SKIP() << "built without NCCL";
  if (NumCudaDevices() < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << NumCudaDevices();
  GroupOptions o;
  o.backend = "nccl";
  o.master_address = "127.0.0.1";
  o.world_size = 2;
  o.group_name = "nccl-test";
  o.timeout = std::chrono::milliseconds(60000);
  o.cuda_device = 0;
  auto sender = WeightSender::Create(o);
  ASSERT_TRUE(sender.ok()) << sender.status();
  std::unique_ptr<WeightReceiver> receiver;
  std::thread join([&] {
    GroupOptions r = o;
    r.rank = 1;
    r.master_port = (*sender)->port();
    r.cuda_device = 1;
    auto connected = ConnectReceiver(r);
    ASSERT_TRUE(connected.ok()) << connected.status();
    receiver = *std::move(connected);
  });
  ASSERT_TRUE((*sender)->WaitForReceivers().ok());
  join.join();
  ASSERT_NE(receiver, nullptr);

  std::vector<TensorSpec> specs = {{"a", "BF16", {3, 5}}, {"b", "F32", {64 << 20}}};
  std::vector<std::vector<uint8_t>> bytes(specs.size());
  std::mt19937 rng(1);
  for (size_t i = 0; i < specs.size(); ++i) {
    bytes[i].resize(*TensorBytes(specs[i]));
    for (auto& b : bytes[i]) b = static_cast<uint8_t>(rng());
  }
  for (int round = 0; round < 2; ++round) {
    absl::Status received;
    std::thread t([&] {
      size_t index = 0;
      received = receiver->Receive(specs, [&](const TensorSpec&, absl::Span<const uint8_t> got) {
        const auto& want = bytes[index++];
        if (got.size() != want.size() || std::memcmp(got.data(), want.data(), got.size()) != 0) {
          return absl::DataLossError("bytes differ");
        }
        return absl::OkStatus();
      });
    });
    std::vector<absl::Span<const uint8_t>> data(bytes.begin(), bytes.end());
    auto stats = (*sender)->Broadcast(specs, data);
    t.join();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(received.ok()) << received;
    spdlog::info("nccl: {} bytes in {:.3f} s", stats->bytes, stats->seconds);
  }
  // A mismatch is still an error on the nccl path, and the group stays in step.
  absl::Status mismatch;
  std::thread t([&] {
    mismatch = receiver->Receive(
        {{"a", "BF16", {5, 3}}, specs[1]},
        [](const TensorSpec&, absl::Span<const uint8_t>) { return absl::OkStatus(); });
  });
  std::vector<absl::Span<const uint8_t>> data(bytes.begin(), bytes.end());
  EXPECT_FALSE((*sender)->Broadcast(specs, data).ok());
  t.join();
  EXPECT_TRUE(absl::IsInvalidArgument(mismatch)) << mismatch;
  (*sender)->Close();
  receiver->Close();
}

}  // namespace
}  // namespace rl::weight_sync
