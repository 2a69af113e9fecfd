// CpuModelRunner contract: input validation (never a crash), weights listing, visiting,
// single-tensor updates, atomic reloads from disk, load errors naming tensor and shape.
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "common/model_io/model_maker.h"
#include "common/model_io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/model/cpu_model_runner.h"
#include "services/worker/model/weights.h"
#include "tests/worker/model/test_util.h"

namespace rl::model {
namespace {

using ::testing::HasSubstr;

class RunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTempDir("runner");
    model_io::MakeModelOptions mo;
    mo.arch = "qwen2";
    mo.seed = 11;
    mo.out_dir = dir_ + "/a";
    ASSERT_TRUE(model_io::MakeModel(mo).ok());
    mo.seed = 12;
    mo.out_dir = dir_ + "/b";
    ASSERT_TRUE(model_io::MakeModel(mo).ok());
    RunnerOptions ro;
    ro.model_dir = dir_ + "/a";
    ro.num_kv_slots = 100;  // rounded down to whole pages
    auto r = CreateCpuModelRunner(ro);
    ASSERT_TRUE(r.ok()) << r.status();
    runner_ = std::move(*r);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<float> Logits(const std::vector<int32_t>& prompt) {
    ForwardInput in;
    SequenceInput s;
    s.token_ids = prompt;
    for (size_t i = 0; i < prompt.size(); ++i) s.kv_slots.push_back(static_cast<int32_t>(i));
    in.seqs = {s};
    ForwardOutput out;
    absl::Status st = runner_->Forward(in, &out);
    EXPECT_TRUE(st.ok()) << st;
    return out.logits;
  }

  std::string dir_;
  std::unique_ptr<ModelRunner> runner_;
};

TEST_F(RunnerTest, Basics) {
  EXPECT_EQ(runner_->backend_name(), "cpu");
  EXPECT_EQ(runner_->page_size(), 16);
  EXPECT_EQ(runner_->num_kv_slots(), 96);
  EXPECT_EQ(runner_->config().arch, model_io::Arch::kQwen2);
  ForwardInput empty;
  ForwardOutput out;
  ASSERT_TRUE(runner_->Forward(empty, &out).ok());
  EXPECT_TRUE(out.logits.empty());
  EXPECT_EQ(out.row_begin, (std::vector<int64_t>{0}));
}

TEST_F(RunnerTest, BadInputsAreInvalidArgument) {
  const std::vector<float> before = Logits({1, 2, 3});
  auto expect_invalid = [&](SequenceInput s, const std::string& what) {
    ForwardInput in;
    in.seqs = {s};
    ForwardOutput out;
    absl::Status st = runner_->Forward(in, &out);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what << ": " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(what));
  };
  SequenceInput ok;
  ok.token_ids = {1, 2};
  ok.kv_slots = {0, 1};
  SequenceInput s = ok;
  s.kv_slots = {0, 96};
  expect_invalid(s, "kv_slots[1]");
  s = ok;
  s.kv_slots = {-1, 0};
  expect_invalid(s, "kv_slots[0]");
  s = ok;
  s.token_ids = {1, 512};
  expect_invalid(s, "token_ids[1]");
  s = ok;
  s.token_ids = {-5, 1};
  expect_invalid(s, "token_ids[0]");
  s = ok;
  s.kv_slots = {0};
  expect_invalid(s, "kv_slots has 1 entries");
  s = ok;
  s.token_ids.clear();
  s.kv_slots.clear();
  expect_invalid(s, "token_ids is empty");
  s = ok;
  s.start_pos = -1;
  expect_invalid(s, "start_pos");
  s = ok;
  s.start_pos = 1023;
  s.kv_slots.assign(1025, 0);
  expect_invalid(s, "exceed the context");
  s = ok;
  s.logits = static_cast<LogitsMode>(7);
  expect_invalid(s, "logits");
  // A bad sequence fails the whole batch even when it comes second.
  ForwardInput in;
  in.seqs = {ok, ok};
  in.seqs[1].kv_slots[0] = 1000;
  ForwardOutput out;
  EXPECT_EQ(runner_->Forward(in, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner_->Forward(in, nullptr).code(), absl::StatusCode::kInvalidArgument);
  // The runner still works.
  EXPECT_EQ(Logits({1, 2, 3}), before);
}

TEST_F(RunnerTest, ListAndVisitWeights) {
  const auto list = runner_->ListWeights();
  const auto& c = runner_->config();
  // embed + final norm + per layer (2 norms, 7 projections, 3 biases); tied head.
  EXPECT_EQ(list.size(), 2 + static_cast<size_t>(c.num_hidden_layers) * 12);
  EXPECT_TRUE(std::is_sorted(list.begin(), list.end(),
                             [](const auto& a, const auto& b) { return a.name < b.name; }));
  EXPECT_EQ(list.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(list.front().dtype, "F32");
  EXPECT_EQ(list.front().shape, (std::vector<int64_t>{c.vocab_size, c.hidden_size}));
  size_t visited = 0;
  int64_t bytes = 0;
  ASSERT_TRUE(runner_
                  ->VisitWeights([&](const TensorInfo& info, absl::Span<const uint8_t> data) {
                    EXPECT_EQ(info.name, list[visited].name);
                    bytes += static_cast<int64_t>(data.size());
                    ++visited;
                  })
                  .ok());
  EXPECT_EQ(visited, list.size());
  EXPECT_GT(bytes, 100000);
}

TEST_F(RunnerTest, UpdateWeightValidatesAndApplies) {
  const std::vector<float> before = Logits({5, 6, 7});
  const auto& c = runner_->config();
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  std::vector<int64_t> shape = {c.hidden_size, c.intermediate_size};
  std::vector<uint16_t> zeros_bf16(static_cast<size_t>(c.hidden_size * c.intermediate_size), 0);
  absl::Span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(zeros_bf16.data()),
                                  zeros_bf16.size() * 2);
  EXPECT_EQ(runner_->UpdateWeight({"no.such.weight", "BF16", shape}, bytes).code(),
            absl::StatusCode::kNotFound);
  auto st = runner_->UpdateWeight({name, "BF16", {shape[1], shape[0]}}, bytes);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("expected [64, 176]"));
  EXPECT_EQ(runner_->UpdateWeight({name, "I64", shape}, bytes).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner_->UpdateWeight({name, "BF16", shape}, bytes.subspan(2)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Logits({5, 6, 7}), before);                                   // nothing changed
  ASSERT_TRUE(runner_->UpdateWeight({name, "BF16", shape}, bytes).ok());  // BF16 → held F32
  EXPECT_NE(Logits({5, 6, 7}), before);
  // The held dtype stays F32 and the bytes are the converted zeros.
  bool checked = false;
  ASSERT_TRUE(runner_
                  ->VisitWeights([&](const TensorInfo& info, absl::Span<const uint8_t> data) {
                    if (info.name != name) return;
                    EXPECT_EQ(info.dtype, "F32");
                    EXPECT_TRUE(
                        std::all_of(data.begin(), data.end(), [](uint8_t b) { return b == 0; }));
                    checked = true;
                  })
                  .ok());
  EXPECT_TRUE(checked);
}

TEST_F(RunnerTest, LoadWeightsFromDiskSwapsAtomically) {
  const std::vector<float> a = Logits({9, 8, 7});
  ASSERT_TRUE(runner_->LoadWeightsFromDisk(dir_ + "/b").ok());
  const std::vector<float> b = Logits({9, 8, 7});
  EXPECT_NE(a, b);
  // A failed load keeps the current weights.
  EXPECT_FALSE(runner_->LoadWeightsFromDisk(dir_ + "/missing").ok());
  EXPECT_EQ(Logits({9, 8, 7}), b);
  ASSERT_TRUE(runner_->LoadWeightsFromDisk(dir_ + "/a").ok());
  EXPECT_EQ(Logits({9, 8, 7}), a);
}

// A staged version (issue 30): read off the runner (model::LoadWeights), served by
// ActivateWeights with a swap that hands the weights served before back to the caller (freed
// after the pause, off the engine thread); a refused activation changes nothing.
TEST_F(RunnerTest, ActivateWeightsSwapsInWeightsReadAhead) {
  const std::vector<float> a = Logits({9, 8, 7});
  auto staged = LoadWeights(dir_ + "/b", runner_->config());
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ(Logits({9, 8, 7}), a);  // read, not served
  const Weights* b_weights = staged->get();
  ASSERT_TRUE(runner_->ActivateWeights(&*staged, dir_ + "/b", "").ok());
  ASSERT_NE(*staged, nullptr);  // the old weights, handed back
  EXPECT_NE(staged->get(), b_weights);
  const std::vector<float> b = Logits({9, 8, 7});
  EXPECT_NE(a, b);
  // What came back is the version served before: activating it serves `a` again.
  ASSERT_TRUE(runner_->ActivateWeights(&*staged, dir_ + "/a", "").ok());
  EXPECT_EQ(Logits({9, 8, 7}), a);
  ASSERT_TRUE(runner_->ActivateWeights(&*staged, dir_ + "/b", "").ok());
  EXPECT_EQ(Logits({9, 8, 7}), b);
  std::unique_ptr<Weights> none;
  EXPECT_EQ(runner_->ActivateWeights(&none, "", "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Logits({9, 8, 7}), b);
}

// WeightsFromOwnedTensors keeps the arena of every served tensor alive and releases the arenas
// that hold only tensors the architecture does not use.
TEST_F(RunnerTest, OwnedTensorsKeepOnlyTheArenasOfServedTensors) {
  auto ckpt = model_io::OpenCheckpoint(dir_ + "/b");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<OwnedTensor> tensors;
  std::vector<std::weak_ptr<const void>> served_arenas;
  auto add = [&](const std::string& name, const std::string& dtype,
                 const std::vector<int64_t>& shape, absl::Span<const uint8_t> bytes) {
    auto arena = std::make_shared<std::vector<uint8_t>>(bytes.begin(), bytes.end());
    tensors.push_back({.info = {name, dtype, shape},
                       .data = arena->data(),
                       .owner = arena,
                       .num_bytes = static_cast<int64_t>(arena->size())});
    return std::weak_ptr<const void>(arena);
  };
  for (const auto& [name, t] : ckpt->tensors()) {
    served_arenas.push_back(add(name, std::string(model_io::DTypeName(t.dtype)), t.shape, t.data));
  }
  const std::vector<uint8_t> extra(64, 0);
  const std::weak_ptr<const void> unused = add("extra.unused_by_the_model", "F32", {16}, extra);
  auto w = WeightsFromOwnedTensors(std::move(tensors), runner_->config());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(unused.expired());  // released with the call
  for (const auto& a : served_arenas) EXPECT_FALSE(a.expired());
  // Served as the checkpoint it was copied from.
  const std::vector<float> a = Logits({9, 8, 7});
  ASSERT_TRUE(runner_->ActivateWeights(&*w, "owned", "").ok());
  w->reset();
  for (const auto& arena : served_arenas) EXPECT_FALSE(arena.expired());
  const std::vector<float> b = Logits({9, 8, 7});
  ASSERT_TRUE(runner_->LoadWeightsFromDisk(dir_ + "/b").ok());
  EXPECT_NE(b, a);
  EXPECT_EQ(Logits({9, 8, 7}), b);
}

TEST_F(RunnerTest, LoadErrorsNameTensorAndShape) {
  auto config = model_io::LoadModelConfig(dir_ + "/a");
  ASSERT_TRUE(config.ok());
  auto ckpt = model_io::OpenCheckpoint(dir_ + "/a");
  ASSERT_TRUE(ckpt.ok());
  // Rewrite the checkpoint without one tensor, then with one tensor mis-shaped.
  std::vector<model_io::TensorToWrite> tensors;
  for (const auto& [name, v] : ckpt->tensors()) {
    if (name == "model.layers.1.self_attn.k_proj.bias") continue;
    tensors.push_back({name, v.dtype, v.shape, v.data});
  }
  ASSERT_TRUE(model_io::WriteCheckpoint(dir_ + "/missing_one", tensors).ok());
  auto missing = LoadWeights(dir_ + "/missing_one", *config);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("'model.layers.1.self_attn.k_proj.bias' (expected shape [32])"));
  tensors.clear();
  for (const auto& [name, v] : ckpt->tensors()) {
    tensors.push_back({name, v.dtype,
                       name == "model.norm.weight" ? std::vector<int64_t>{8, 8} : v.shape, v.data});
  }
  ASSERT_TRUE(model_io::WriteCheckpoint(dir_ + "/misshaped", tensors).ok());
  auto misshaped = LoadWeights(dir_ + "/misshaped", *config);
  ASSERT_FALSE(misshaped.ok());
  EXPECT_THAT(std::string(misshaped.status().message()),
              HasSubstr("'model.norm.weight' has shape [8, 8], expected [64]"));
  EXPECT_FALSE(runner_->LoadWeightsFromDisk(dir_ + "/misshaped").ok());
}

TEST(RunnerOptionsTest, BadOptions) {
  RunnerOptions ro;
  ro.model_dir = "/nonexistent";
  EXPECT_FALSE(CreateCpuModelRunner(ro).ok());
  ro.model_dir = testing::DataDir() + "/stories260K";
  ro.page_size = 0;
  EXPECT_EQ(CreateCpuModelRunner(ro).status().code(), absl::StatusCode::kInvalidArgument);
  ro.page_size = 16;
  ro.kv_cache_bytes = 100;
  EXPECT_EQ(CreateCpuModelRunner(ro).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rl::model
