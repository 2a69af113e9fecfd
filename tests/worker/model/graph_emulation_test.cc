// The Transformer's CUDA-graph logic, checked on the CPU: a backend that emulates graph capture
// (ops between BeginGraphCapture and EndGraphCapture are recorded with their parameters and run
// only on ReplayGraph; allocating or copying while recording is an error, as under CUDA) wraps
// the CPU backend. Decode steps then go through padding to batch buckets, the scratch KV slot,
// split buckets, capture, replay and re-capture after buffers move — and, the CPU kernels being
// batch-invariant, must give logits bit-identical to plain eager steps.
#include <cstring>
#include <functional>
#include <map>

#include "common/model_io/model_maker.h"
#include "gtest/gtest.h"
#include "services/worker/model/backend.h"
#include "services/worker/model/transformer.h"
#include "services/worker/model/weights.h"
#include "tests/worker/model/test_util.h"

namespace rl::model {
namespace {

class GraphEmulatingBackend final : public Backend {
 public:
  GraphEmulatingBackend() : cpu_(CreateCpuBackend(2)) {}

  std::string name() const override { return "graph-emulation"; }
  int num_threads() const override { return cpu_->num_threads(); }
  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) override {
    if (recording_) return absl::FailedPreconditionError("allocation while capturing");
    ++allocations_;
    return cpu_->Allocate(bytes);
  }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    if (recording_) return absl::FailedPreconditionError("copy while capturing");
    return cpu_->CopyToDevice(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    if (recording_) return absl::FailedPreconditionError("copy while capturing");
    return cpu_->CopyToHost(dst, src, bytes);
  }
  absl::Status Embedding(const kernels::EmbeddingParams& p) override {
    return Run([this, p] { return cpu_->Embedding(p); });
  }
  absl::Status RmsNorm(const kernels::RmsNormParams& p) override {
    return Run([this, p] { return cpu_->RmsNorm(p); });
  }
  absl::Status AddRmsNorm(const float* delta, const kernels::RmsNormParams& p) override {
    return Run([this, delta, p] { return cpu_->AddRmsNorm(delta, p); });
  }
  absl::Status Matmul(const kernels::MatmulParams& p) override {
    return Run([this, p] { return cpu_->Matmul(p); });
  }
  absl::Status Rope(const kernels::RopeParams& p) override {
    return Run([this, p] { return cpu_->Rope(p); });
  }
  absl::Status WriteKv(const kernels::WriteKvParams& p) override {
    return Run([this, p] { return cpu_->WriteKv(p); });
  }
  absl::Status Attention(const kernels::AttentionParams& p) override {
    return Run([this, p] { return cpu_->Attention(p); });
  }
  absl::Status SiluMul(const kernels::SiluMulParams& p) override {
    return Run([this, p] { return cpu_->SiluMul(p); });
  }
  absl::Status AddInPlace(const float* x, float* y, int64_t n) override {
    return Run([this, x, y, n] { return cpu_->AddInPlace(x, y, n); });
  }
  absl::Status GatherRows(const float* x, const int32_t* rows, int64_t num_rows, int64_t dim,
                          float* out) override {
    return Run([=, this] { return cpu_->GatherRows(x, rows, num_rows, dim, out); });
  }

  bool supports_graphs() const override { return true; }
  absl::Status BeginGraphCapture() override {
    recording_ = true;
    recorded_.clear();
    return absl::OkStatus();
  }
  absl::StatusOr<int> EndGraphCapture(absl::Status recorded) override {
    recording_ = false;
    if (!recorded.ok()) return recorded;
    graphs_[next_] = std::move(recorded_);
    ++captures_;
    return next_++;
  }
  absl::Status ReplayGraph(int graph) override {
    auto it = graphs_.find(graph);
    if (it == graphs_.end()) return absl::NotFoundError("dropped");
    ++replays_;
    for (const auto& op : it->second) {
      if (absl::Status s = op(); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  void DropGraphs() override {
    drops_ += graphs_.empty() ? 0 : 1;
    graphs_.clear();
  }

  int captures_ = 0;
  int replays_ = 0;
  int drops_ = 0;
  int allocations_ = 0;

 private:
  absl::Status Run(std::function<absl::Status()> op) {
    if (!recording_) return op();
    recorded_.push_back(std::move(op));
    return absl::OkStatus();
  }

  std::unique_ptr<Backend> cpu_;
  bool recording_ = false;
  std::vector<std::function<absl::Status()>> recorded_;
  std::map<int, std::vector<std::function<absl::Status()>>> graphs_;
  int next_ = 0;
};

class GraphEmulationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTempDir("graph_emulation");
    model_io::MakeModelOptions mo;
    mo.arch = "qwen3";
    mo.seed = 9;
    mo.out_dir = dir_;
    ASSERT_TRUE(model_io::MakeModel(mo).ok());
    auto config = model_io::LoadModelConfig(dir_);
    ASSERT_TRUE(config.ok());
    config_ = *config;
    auto w = LoadWeights(dir_, config_);
    ASSERT_TRUE(w.ok()) << w.status();
    weights_ = std::move(*w);
    auto g = Transformer::Create(config_, &graph_backend_, kSlots, /*use_graphs=*/true);
    ASSERT_TRUE(g.ok()) << g.status();
    graphs_ = std::move(*g);
    cpu_ = CreateCpuBackend(2);
    auto e = Transformer::Create(config_, cpu_.get(), kSlots);
    ASSERT_TRUE(e.ok()) << e.status();
    eager_ = std::move(*e);
    ASSERT_TRUE(graphs_->uses_graphs());
    ASSERT_FALSE(eager_->uses_graphs());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `in` through both transformers and checks the logits are bit-identical.
  ForwardOutput Both(const ForwardInput& in) {
    ForwardOutput g, e;
    absl::Status gs = graphs_->Forward(*weights_, in, &g);
    absl::Status es = eager_->Forward(*weights_, in, &e);
    EXPECT_TRUE(gs.ok()) << gs;
    EXPECT_TRUE(es.ok()) << es;
    EXPECT_EQ(g.row_begin, e.row_begin);
    EXPECT_EQ(g.logits.size(), e.logits.size());
    if (g.logits.size() == e.logits.size()) {
      EXPECT_EQ(std::memcmp(g.logits.data(), e.logits.data(), g.logits.size() * sizeof(float)), 0);
    }
    return e;
  }

  static constexpr int64_t kSlots = 4096;
  std::string dir_;
  model_io::ModelConfig config_;
  std::unique_ptr<Weights> weights_;
  GraphEmulatingBackend graph_backend_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Transformer> graphs_, eager_;
};

TEST_F(GraphEmulationTest, DecodeThroughGraphsEqualsEager) {
  // 5 sequences (bucket 8: three padding rows) with prompts of different lengths, so contexts
  // cross the 256-position split border during decode and the graph key changes.
  const std::vector<int32_t> prompt_len = {250, 3, 40, 254, 1};
  std::vector<SequenceInput> seqs(prompt_len.size());
  for (size_t b = 0; b < seqs.size(); ++b) {
    for (int32_t i = 0; i < prompt_len[b]; ++i) {
      seqs[b].token_ids.push_back(static_cast<int32_t>((b * 37 + i * 11) % 250 + 1));
      seqs[b].kv_slots.push_back(static_cast<int32_t>(b * 600 + i));
    }
  }
  ForwardInput prefill;
  prefill.seqs = seqs;
  ForwardOutput out = Both(prefill);  // eager on both (not decode-only)
  EXPECT_EQ(graph_backend_.captures_, 0);
  for (int step = 0; step < 10; ++step) {
    for (size_t b = 0; b < seqs.size(); ++b) {
      SequenceInput& s = seqs[b];
      const int32_t next =
          testing::Argmax(&out.logits[out.row_begin[b] * out.vocab_size], out.vocab_size);
      s.start_pos += static_cast<int32_t>(s.token_ids.size());
      s.token_ids = {next};
      s.kv_slots.push_back(static_cast<int32_t>(b * 600 + s.start_pos));
    }
    ForwardInput decode;
    decode.seqs = seqs;
    out = Both(decode);
  }
  // Keys: (8, 1 split) until a context passes 256, then (8, 2 splits): two captures, the other
  // eight steps replayed.
  EXPECT_EQ(graph_backend_.captures_, 2);
  EXPECT_EQ(graph_backend_.replays_, 8);
  EXPECT_EQ(graphs_->num_graphs(), 2);
}

TEST_F(GraphEmulationTest, BucketsPaddingAndRecaptureAfterBuffersGrow) {
  std::vector<SequenceInput> seqs;
  auto decode_step = [&](int n) {
    ForwardInput in;
    for (int b = 0; b < n; ++b) {
      SequenceInput s;
      s.start_pos = 0;
      s.token_ids = {static_cast<int32_t>(b + 1)};
      s.kv_slots = {static_cast<int32_t>(b)};
      in.seqs.push_back(s);
    }
    return in;
  };
  Both(decode_step(1));  // bucket 1: capture
  Both(decode_step(1));  // replay
  Both(decode_step(3));  // bucket 4: buffers grow (drop), capture
  Both(decode_step(4));  // bucket 4: replay
  EXPECT_EQ(graph_backend_.captures_, 2);
  EXPECT_EQ(graph_backend_.replays_, 2);
  EXPECT_GE(graph_backend_.drops_, 1);
  // A large prefill grows every buffer: graphs are dropped and the next decode captures again.
  ForwardInput big;
  SequenceInput s;
  for (int i = 0; i < 300; ++i) {
    s.token_ids.push_back(i % 200 + 1);
    s.kv_slots.push_back(1000 + i);
  }
  big.seqs = {s};
  Both(big);
  EXPECT_EQ(graphs_->num_graphs(), 0);
  Both(decode_step(4));
  EXPECT_EQ(graph_backend_.captures_, 3);
  // Over 256 sequences, or a sequence with two tokens: eager.
  Both(decode_step(257));
  ForwardInput two = decode_step(2);
  two.seqs[1].token_ids = {5, 6};
  two.seqs[1].kv_slots = {10, 11};
  Both(two);
  EXPECT_EQ(graph_backend_.captures_, 3);
}

TEST_F(GraphEmulationTest, NewWeightsDropTheGraphs) {
  ForwardInput in;
  SequenceInput s;
  s.token_ids = {7};
  s.kv_slots = {0};
  in.seqs = {s};
  Both(in);
  Both(in);
  EXPECT_EQ(graph_backend_.captures_, 1);
  auto other = LoadWeights(dir_, config_);
  ASSERT_TRUE(other.ok());
  ForwardOutput g;
  ASSERT_TRUE(graphs_->Forward(**other, in, &g).ok());
  EXPECT_EQ(graph_backend_.captures_, 2);  // graphs hold weight addresses: captured again
}

}  // namespace
}  // namespace rl::model
