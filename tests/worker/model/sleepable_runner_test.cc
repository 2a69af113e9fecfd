// SleepableRunner over the stories260K CPU runner: release frees the backend and resume
// restores exactly what was served (the last folder, or the spill of weights changed in
// memory); updates while released are checked and staged, then served on resume; a folder that
// changed on disk while released is refused on resume; released() is the published state.
#include "services/worker/model/sleepable_runner.h"

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/model_io/dtype.h"
#include "common/model_io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/model/cpu_model_runner.h"
#include "tests/testing/test_data.h"

namespace rl::model {
namespace {

using ::rl::testing::Stories;
using ::rl::testing::TempDir;
using ::testing::HasSubstr;

using Weights = std::map<std::string, std::vector<uint8_t>>;

// Every served tensor's bytes.
Weights Served(const ModelRunner& runner) {
  Weights out;
  absl::Status s = runner.VisitWeights([&](const TensorInfo& info, absl::Span<const uint8_t> b) {
    out[info.name].assign(b.begin(), b.end());
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// A copy of stories260K in `dir` with every F32 tensor whose name contains `match` scaled.
void WriteScaledCopy(const std::string& dir, const std::string& match, float scale) {
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(Stories() + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto ckpt = model_io::OpenCheckpoint(Stories());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<std::vector<uint8_t>> storage;
  std::vector<model_io::TensorToWrite> out;
  for (const auto& [name, t] : ckpt->tensors()) {
    storage.emplace_back(t.data.begin(), t.data.end());
    if (name.find(match) != std::string::npos && t.dtype == model_io::DType::kF32) {
      auto* f = reinterpret_cast<float*>(storage.back().data());
      for (size_t i = 0; i < storage.back().size() / 4; ++i) f[i] *= scale;
    }
    out.push_back({name, t.dtype, t.shape, {}});
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].data = storage[i];
  ASSERT_TRUE(model_io::WriteSafetensors(dir + "/model.safetensors", out).ok());
}

class SleepableRunnerTest : public ::testing::Test {
 protected:
  // A runner whose factory loads `model_dir` (counting its calls).
  std::unique_ptr<SleepableRunner> Make(const std::string& model_dir) {
    RunnerOptions options;
    options.model_dir = model_dir;
    options.num_threads = 1;
    options.kv_cache_bytes = 4 << 20;
    auto runner = SleepableRunner::Create(
        [this, options] {
          ++factory_calls_;
          return CreateCpuModelRunner(options);
        },
        spill_.path() + "/spill", model_dir);
    EXPECT_TRUE(runner.ok()) << runner.status();
    return runner.ok() ? *std::move(runner) : nullptr;
  }

  // The first F32 weight and a copy of it with every value doubled.
  static std::pair<TensorInfo, std::vector<uint8_t>> Doubled(const SleepableRunner& runner,
                                                             const Weights& served) {
    for (const TensorInfo& t : runner.ListWeights()) {
      if (t.dtype != "F32") continue;
      std::vector<uint8_t> bytes = served.at(t.name);
      auto* f = reinterpret_cast<float*>(bytes.data());
      for (size_t i = 0; i < bytes.size() / 4; ++i) f[i] = f[i] * 2 + 1;
      return {t, bytes};
    }
    ADD_FAILURE() << "no F32 weight";
    return {};
  }

  TempDir spill_;
  int factory_calls_ = 0;
};

TEST_F(SleepableRunnerTest, ReleaseFreesTheBackendAndResumeRestoresIt) {
  auto runner = Make(Stories());
  ASSERT_NE(runner, nullptr);
  const Weights before = Served(*runner);
  const std::vector<TensorInfo> infos = runner->ListWeights();
  const int64_t slots = runner->num_kv_slots();
  EXPECT_FALSE(runner->released());

  ASSERT_TRUE(runner->Release().ok());
  EXPECT_TRUE(runner->released());
  ForwardInput in;
  ForwardOutput out;
  EXPECT_EQ(runner->Forward(in, &out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(runner->VisitWeights([](const TensorInfo&, absl::Span<const uint8_t>) {}).code(),
            absl::StatusCode::kFailedPrecondition);
  // What the rest of the worker reads while asleep stays available.
  EXPECT_EQ(runner->ListWeights().size(), infos.size());
  EXPECT_EQ(runner->num_kv_slots(), slots);
  EXPECT_EQ(runner->config().vocab_size, 512);
  EXPECT_TRUE(runner->Release().ok());                              // idempotent
  EXPECT_FALSE(std::filesystem::exists(spill_.path() + "/spill"));  // nothing changed: no spill

  ASSERT_TRUE(runner->Resume().ok());
  EXPECT_FALSE(runner->released());
  EXPECT_EQ(factory_calls_, 2);
  EXPECT_EQ(Served(*runner), before);
  EXPECT_TRUE(runner->Resume().ok());  // idempotent
  EXPECT_EQ(factory_calls_, 2);
}

TEST_F(SleepableRunnerTest, WeightsChangedInMemoryAreSpilledAndRestored) {
  auto runner = Make(Stories());
  ASSERT_NE(runner, nullptr);
  auto [info, doubled] = Doubled(*runner, Served(*runner));
  ASSERT_TRUE(runner->UpdateWeight(info, doubled).ok());
  const Weights changed = Served(*runner);
  ASSERT_TRUE(runner->Release().ok());
  EXPECT_TRUE(std::filesystem::exists(spill_.path() + "/spill/spill-1/model.safetensors"));
  ASSERT_TRUE(runner->Resume().ok());
  EXPECT_EQ(Served(*runner), changed);
  EXPECT_FALSE(std::filesystem::exists(spill_.path() + "/spill/spill-1"));  // removed on resume
}

TEST_F(SleepableRunnerTest, UpdatesWhileReleasedAreCheckedStagedAndServedOnResume) {
  auto runner = Make(Stories());
  ASSERT_NE(runner, nullptr);
  const Weights before = Served(*runner);
  auto [info, doubled] = Doubled(*runner, before);
  ASSERT_TRUE(runner->Release().ok());

  TensorInfo unknown = info;
  unknown.name = "no.such.weight";
  EXPECT_THAT(runner->UpdateWeight(unknown, doubled).message(), HasSubstr("no such weight"));
  EXPECT_EQ(runner->UpdateWeight(info, absl::MakeSpan(doubled).subspan(4)).code(),
            absl::StatusCode::kInvalidArgument);
  TensorInfo reshaped = info;
  reshaped.shape.push_back(1);
  EXPECT_EQ(runner->UpdateWeight(reshaped, doubled).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(runner->UpdateWeight(info, doubled).ok());
  EXPECT_TRUE(runner->released());  // staged, not applied

  ASSERT_TRUE(runner->Resume().ok());
  Weights expected = before;
  expected[info.name] = doubled;
  EXPECT_EQ(Served(*runner), expected);
}

TEST_F(SleepableRunnerTest, ADiskUpdateWhileReleasedReplacesWhatIsReloaded) {
  TempDir dir;
  WriteScaledCopy(dir.path(), "mlp", 1.5f);
  auto reference = Make(dir.path());
  ASSERT_NE(reference, nullptr);
  const Weights scaled = Served(*reference);

  auto runner = Make(Stories());
  ASSERT_NE(runner, nullptr);
  auto [info, doubled] = Doubled(*runner, Served(*runner));
  ASSERT_TRUE(runner->UpdateWeight(info, doubled).ok());  // spilled at release, then replaced
  ASSERT_TRUE(runner->Release().ok());
  EXPECT_FALSE(runner->LoadWeightsFromDisk(dir.path() + "/missing").ok());
  ASSERT_TRUE(runner->LoadWeightsFromDisk(dir.path()).ok());
  ASSERT_TRUE(runner->Resume().ok());
  EXPECT_EQ(Served(*runner), scaled);
}

// A folder saved over while the runner is released would serve other weights under the same
// version on resume: refused, and the runner stays released until a disk update names what to
// serve.
TEST_F(SleepableRunnerTest, AFolderChangedWhileReleasedIsRefusedOnResume) {
  TempDir dir;
  WriteScaledCopy(dir.path(), "attn", 1.0f);
  auto runner = Make(dir.path());
  ASSERT_NE(runner, nullptr);
  ASSERT_TRUE(runner->Release().ok());
  WriteScaledCopy(dir.path(), "attn", 2.0f);  // the trainer saves its next checkpoint here
  absl::Status refused = runner->Resume();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("changed on disk"));
  EXPECT_TRUE(runner->released());
  ASSERT_TRUE(runner->LoadWeightsFromDisk(dir.path()).ok());
  ASSERT_TRUE(runner->Resume().ok());
  EXPECT_FALSE(runner->released());
}

TEST_F(SleepableRunnerTest, AFailedResumeStaysReleased) {
  RunnerOptions options;
  options.model_dir = Stories();
  options.num_threads = 1;
  options.kv_cache_bytes = 4 << 20;
  bool fail = false;
  auto runner = SleepableRunner::Create(
      [&fail, options]() -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
        if (fail) return absl::ResourceExhaustedError("no device memory");
        return CreateCpuModelRunner(options);
      },
      spill_.path(), Stories());
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_TRUE((*runner)->Release().ok());
  fail = true;
  EXPECT_EQ((*runner)->Resume().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*runner)->released());
  fail = false;
  ASSERT_TRUE((*runner)->Resume().ok());
  EXPECT_FALSE((*runner)->released());
}

}  // namespace
}  // namespace rl::model
