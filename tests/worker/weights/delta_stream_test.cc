// Delta updates over the tensor stream and the tcp group (issue 30), on in-process rl-workers
// (stories260K F32 and stories260K-bf16):
//   - property: random steps (1-4 tensors changed per step, unchanged / 2% / 30% / every word,
//     scattered or clustered; per tensor overwrite, xor, the size-chosen encoding or the whole
//     tensor; payloads cut into random chunks sent in random order; one call or staged then
//     activated; with or without the manifest) sent as a delta stream to one worker and as a
//     dense stream to another: both end with the checksum the test computes for the new state,
//     every step, for F32 and BF16 tensors (F16 deltas: tests/common/weight_sync/delta_test.cc;
//     no F16 model is served here);
//   - refusals: a parent the worker does not serve (FAILED_PRECONDITION naming both versions),
//     a malformed payload, an oversized payload_bytes, a non-finite value, a manifest the result
//     does not match, an encoded chunk without parent_version: nothing applied or staged;
//   - cuts: a staged delta stream cut at every message index (half-close without the end, or
//     cancelled), inside a payload (a tensor short of its payload at the end), before `end` and
//     after `end` before the half-close (cancelled) stages nothing and leaves the served
//     checksum as it was; the same for a staged delta group receive (the trainer dies before the
//     first bucket or after any bucket, or broadcasts a payload cut at a random byte offset, or
//     a corrupted one), staged or applied;
//   - the tcp group tests run twice: one ReceiveWeights call, and the two-phase
//     PrepareWeightsUpdate{parent_version} / CompleteWeightsUpdate (the parent checked at Prepare,
//     and again at Complete when another version was activated in between);
//   - GetServerInfo's staged_weights_sha256 / staged_parent_version for a staged delta.
#include <algorithm>
#include <cstring>
#include <future>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/model_io/dtype.h"
#include "common/weight_sync/delta.h"
#include "common/weight_sync/manifest.h"
#include "tests/testing/tensor_stream.h"
#include "tests/testing/weight_state.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using Stub = rl::v1::Admin::Stub;
using Request = rl::v1::UpdateWeightsFromTensorRequest;
using model_io::DType;
using ::rl::testing::Change;
using ::rl::testing::ChunksOf;
using ::rl::testing::ManifestOf;
using ::rl::testing::ReadState;
using ::rl::testing::State;
using ::rl::testing::Step;
using ::rl::testing::Tensor;
using weight_sync::DeltaEncoding;
using weight_sync::TensorDelta;

class Worker {
 public:
  explicit Worker(const std::string& model) {
    WorkerConfig config;
    config.model_path = model;
    config.port = 0;
    config.kv_cache_gb = 0.01;
    config.num_threads = 1;
    auto server = WorkerServer::Start(config);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return;
    server_ = *std::move(server);
    admin_ = rl::v1::Admin::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  ~Worker() {
    if (server_) server_->Shutdown();
  }
  bool ok() const { return server_ != nullptr; }

  template <typename Req, typename Resp, typename Fn>
  grpc::Status Call(Fn fn, const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    return (admin_.get()->*fn)(&ctx, req, resp);
  }
  grpc::Status Send(const std::vector<Request>& messages, rl::v1::AdminResponse* resp) {
    grpc::ClientContext ctx;
    return ::rl::testing::SendMessages(*admin_, &ctx, messages, resp);
  }
  std::string Checksum() {
    rl::v1::WeightsCheckerRequest req;
    req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
    rl::v1::WeightsCheckerResponse resp;
    EXPECT_TRUE(Call(&Stub::WeightsChecker, req, &resp).ok());
    return resp.rank_sha256();
  }
  rl::v1::GetServerInfoResponse Info() {
    rl::v1::GetServerInfoResponse info;
    EXPECT_TRUE(Call(&Stub::GetServerInfo, rl::v1::GetServerInfoRequest(), &info).ok());
    return info;
  }
  grpc::Status Activate(int64_t version) {
    rl::v1::ActivateWeightsRequest req;
    req.set_weight_version(version);
    rl::v1::AdminResponse resp;
    return Call(&Stub::ActivateWeights, req, &resp);
  }
  // The worker serves what `state` says, and nothing is staged.
  void ExpectServes(const State& state, int64_t version) {
    EXPECT_EQ(server_->weight_version(), version);
    EXPECT_EQ(Checksum(), ManifestOf(state, version, 0).sha256);
    const rl::v1::GetServerInfoResponse info = Info();
    EXPECT_FALSE(info.has_staged_weights());
    EXPECT_FALSE(info.staging());
  }
  rl::v1::Admin::Stub& admin() { return *admin_; }
  WorkerServer& server() { return *server_; }

 private:
  std::unique_ptr<WorkerServer> server_;
  std::unique_ptr<rl::v1::Admin::Stub> admin_;
};

// A random step of `state`: 1-4 tensors changed, each encoded one way; `state` becomes the child.
std::vector<Change> RandomStep(State* state, std::mt19937& rng) {
  std::vector<std::string> names;
  for (const auto& [name, t] : *state) names.push_back(name);
  std::shuffle(names.begin(), names.end(), rng);
  names.resize(1 + rng() % 4);
  std::vector<Change> out;
  for (const std::string& name : names) {
    Tensor& t = state->at(name);
    const DType dtype = *model_io::ParseDType(t.dtype);
    const double densities[] = {0.0, 0.02, 0.3, 1.0};
    const std::vector<uint8_t> child = Step(dtype, t.bytes, densities[rng() % 4], rng() % 2, rng);
    Change c{name, {t.dtype, t.shape, child}, std::nullopt};
    switch (rng() % 4) {
      case 0:
        c.delta = *weight_sync::EncodeDelta(dtype, t.bytes, child);
        break;
      case 1:
        c.delta = *weight_sync::EncodeDeltaAs(DeltaEncoding::kOverwrite, dtype, t.bytes, child);
        break;
      case 2:
        c.delta = *weight_sync::EncodeDeltaAs(DeltaEncoding::kXor, dtype, t.bytes, child);
        break;
      default:
        break;  // whole
    }
    t.bytes = child;
    out.push_back(std::move(c));
  }
  return out;
}

Request DeltaOptions(int64_t parent, int64_t version, bool stage, const std::string& manifest) {
  Request options;
  options.set_parent_version(parent);
  options.set_weight_version(version);
  options.set_stage(stage);
  options.set_manifest_json(manifest);
  return options;
}

class DeltaStreamTest : public ::testing::Test {
 protected:
  // Random delta steps to `a`, the same steps dense to `b`: checksums equal every time.
  void RunProperty(const std::string& model, uint32_t seed, int steps) {
    Worker a(model), b(model);
    ASSERT_TRUE(a.ok() && b.ok());
    State state = ReadState(model);
    ASSERT_FALSE(state.empty());
    // The test's model of the served state is the worker's (dtypes as served).
    rl::v1::ListWeightsResponse listed;
    ASSERT_TRUE(a.Call(&Stub::ListWeights, rl::v1::ListWeightsRequest(), &listed).ok());
    for (const auto& w : listed.weights()) {
      ASSERT_TRUE(state.count(w.name())) << w.name();
      ASSERT_EQ(state.at(w.name()).dtype, w.dtype()) << w.name();
    }
    ASSERT_EQ(a.Checksum(), ManifestOf(state, 0, 0).sha256);
    std::mt19937 rng(seed);
    for (int step = 1; step <= steps; ++step) {
      SCOPED_TRACE(absl::StrCat("step ", step, " seed ", seed));
      const std::vector<Change> changes = RandomStep(&state, rng);
      const bool stage = step % 2 == 0;
      const bool with_manifest = rng() % 2 == 0;
      const weight_sync::Manifest m = ManifestOf(state, step, step - 1);
      rl::v1::AdminResponse resp;
      const std::vector<Request> delta = ::rl::testing::StreamMessages(
          ChunksOf(changes, rng),
          DeltaOptions(step - 1, step, stage, with_manifest ? ManifestToJson(m) : ""));
      grpc::Status s = a.Send(delta, &resp);
      ASSERT_TRUE(s.ok()) << s.error_message();
      if (stage) {
        const rl::v1::GetServerInfoResponse info = a.Info();
        ASSERT_TRUE(info.has_staged_weights());
        EXPECT_EQ(info.staged_weight_version(), step);
        EXPECT_EQ(info.staged_parent_version(), step - 1);
        EXPECT_EQ(info.staged_weights_sha256(), with_manifest ? m.sha256 : "");
        EXPECT_EQ(a.server().weight_version(), step - 1);  // staged, not served
        s = a.Activate(step);
        ASSERT_TRUE(s.ok()) << s.error_message();
      }
      // The same step as a dense stream of the changed tensors.
      std::vector<Change> whole = changes;
      for (Change& c : whole) c.delta.reset();
      Request dense_options;
      dense_options.set_weight_version(step);
      ASSERT_TRUE(
          b.Send(::rl::testing::StreamMessages(ChunksOf(whole, rng), dense_options), &resp).ok());
      EXPECT_EQ(a.server().weight_version(), step);
      EXPECT_EQ(a.Checksum(), m.sha256);
      EXPECT_EQ(b.Checksum(), m.sha256);
    }
  }
};

TEST_F(DeltaStreamTest, RandomDeltaStreamsEqualDenseStreamsF32) {
  RunProperty(Stories(), 1234, 10);
}

TEST_F(DeltaStreamTest, RandomDeltaStreamsEqualDenseStreamsBf16) {
  RunProperty(DataDir() + "/stories260K-bf16", 99, 10);
}

TEST_F(DeltaStreamTest, RefusedDeltaStreamsChangeNothing) {
  Worker w(Stories());
  ASSERT_TRUE(w.ok());
  const State state = ReadState(Stories());
  std::mt19937 rng(7);
  State next = state;
  const std::vector<Change> changes = RandomStep(&next, rng);
  const std::string down = "model.layers.0.mlp.down_proj.weight";  // [64, 172] F32
  const Tensor& t = state.at(down);
  std::vector<uint8_t> child = Step(DType::kF32, t.bytes, 0.02, false, rng);
  const TensorDelta good =
      *weight_sync::EncodeDeltaAs(DeltaEncoding::kOverwrite, DType::kF32, t.bytes, child);
  ASSERT_GT(good.count, 0);
  auto stream = [&](const TensorDelta& d, const Request& options) {
    return ::rl::testing::StreamMessages(ChunksOf({{down, {t.dtype, t.shape, child}, d}}, rng),
                                         options);
  };
  struct Case {
    const char* what;
    std::vector<Request> messages;
    grpc::StatusCode code;
    const char* says;
  };
  std::vector<Case> cases;
  // A parent the worker does not serve: refused at the first message, naming both versions.
  cases.push_back({"parent not served", stream(good, DeltaOptions(5, 6, false, "")),
                   grpc::StatusCode::FAILED_PRECONDITION, "applies to version 5"});
  cases.push_back({"parent not served (stage)", stream(good, DeltaOptions(5, 6, true, "")),
                   grpc::StatusCode::FAILED_PRECONDITION, "serves version 0"});
  // A count the payload does not carry (the payload is checked whole).
  TensorDelta short_count = good;
  short_count.count -= 1;
  cases.push_back({"count", stream(short_count, DeltaOptions(0, 1, true, "")),
                   grpc::StatusCode::INVALID_ARGUMENT, "left over"});
  // An index past the tensor.
  TensorDelta past;
  past.encoding = DeltaEncoding::kOverwrite;
  past.count = 1;
  past.payload = {0xff, 0xff, 0x03, 0, 0, 0, 0};  // gap 65535 > 64 * 172 words
  cases.push_back({"index past the end", stream(past, DeltaOptions(0, 1, false, "")),
                   grpc::StatusCode::INVALID_ARGUMENT, "index past"});
  // A NaN written by the delta.
  std::vector<uint8_t> nan_child = t.bytes;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan_child.data() + 40, &nan, 4);
  cases.push_back({"non-finite",
                   ::rl::testing::StreamMessages(
                       ChunksOf({{down,
                                  {t.dtype, t.shape, nan_child},
                                  *weight_sync::EncodeDelta(DType::kF32, t.bytes, nan_child)}},
                                rng),
                       DeltaOptions(0, 1, true, "")),
                   grpc::StatusCode::INVALID_ARGUMENT, "NaN"});
  // payload_bytes beyond the largest encoding of its count: refused before it is allocated.
  std::vector<Request> huge = stream(good, DeltaOptions(0, 1, false, ""));
  huge[0].mutable_chunk()->set_payload_bytes(int64_t{1} << 40);
  cases.push_back({"payload_bytes", huge, grpc::StatusCode::INVALID_ARGUMENT, "payload_bytes"});
  // A manifest the result does not match (it describes another step).
  cases.push_back({"manifest",
                   stream(good, DeltaOptions(0, 1, true, ManifestToJson(ManifestOf(next, 1, 0)))),
                   grpc::StatusCode::FAILED_PRECONDITION, "nothing is staged"});
  // An encoded chunk in a stream that names no parent.
  Request plain;
  plain.set_weight_version(1);
  cases.push_back({"no parent", stream(good, plain), grpc::StatusCode::INVALID_ARGUMENT,
                   "names no parent_version"});
  // An unknown encoding.
  std::vector<Request> unknown = stream(good, DeltaOptions(0, 1, false, ""));
  unknown[0].mutable_chunk()->set_encoding("zstd");
  cases.push_back({"encoding", unknown, grpc::StatusCode::INVALID_ARGUMENT, "chunk.encoding"});
  // The same tensor delta-encoded and whole.
  std::vector<rl::v1::TensorChunk> both = ChunksOf({{down, {t.dtype, t.shape, child}, good}}, rng);
  const std::vector<rl::v1::TensorChunk> whole =
      ChunksOf({{down, {t.dtype, t.shape, child}, std::nullopt}}, rng);
  both.push_back(whole.front());
  cases.push_back({"both", ::rl::testing::StreamMessages(both, DeltaOptions(0, 1, false, "")),
                   grpc::StatusCode::INVALID_ARGUMENT, "both delta-encoded and whole"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    rl::v1::AdminResponse resp;
    const grpc::Status s = w.Send(c.messages, &resp);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    EXPECT_NE(s.error_message().find(c.says), std::string::npos) << s.error_message();
    w.ExpectServes(state, 0);
  }
  // The good one applies.
  rl::v1::AdminResponse resp;
  const grpc::Status s = w.Send(stream(good, DeltaOptions(0, 1, false, "")), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  State applied = state;
  applied.at(down).bytes = child;
  w.ExpectServes(applied, 1);
  // A staged delta whose parent is no longer served when activated: refused, nothing changes.
  std::vector<uint8_t> child2 = Step(DType::kF32, child, 0.02, false, rng);
  const TensorDelta d2 = *weight_sync::EncodeDelta(DType::kF32, child, child2);
  ASSERT_TRUE(
      w.Send(::rl::testing::StreamMessages(ChunksOf({{down, {t.dtype, t.shape, child2}, d2}}, rng),
                                           DeltaOptions(1, 2, true, "")),
             &resp)
          .ok());
  Request bump;
  bump.set_weight_version(3);
  ASSERT_TRUE(w.Send(::rl::testing::StreamMessages(
                         ChunksOf({{down, {t.dtype, t.shape, child}, std::nullopt}}, rng), bump),
                     &resp)
                  .ok());
  const grpc::Status late = w.Activate(2);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << late.error_message();
  EXPECT_NE(late.error_message().find("built on a copy of version 1"), std::string::npos)
      << late.error_message();
  EXPECT_EQ(w.server().weight_version(), 3);
  EXPECT_EQ(w.Checksum(), ManifestOf(applied, 3, 0).sha256);
}

// A staged delta stream cut anywhere stages nothing and leaves the served weights as they were.
// Waits (up to 10 s) until the worker's GetServerInfo says `staging`. A client's cancel ends its
// call at once, while the worker may not even have read the stream's first message yet (under
// load): waiting for the slot to be taken first, then released, is what makes "nothing was left
// staged" a check and not a race.
void AwaitStaging(Worker& w, bool staging) {
  for (int i = 0; i < 5000 && w.Info().staging() != staging; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(w.Info().staging(), staging);
}

TEST_F(DeltaStreamTest, AStagedDeltaStreamCutAnywhereStagesNothing) {
  Worker w(Stories());
  ASSERT_TRUE(w.ok());
  const State state = ReadState(Stories());
  std::mt19937 rng(31);
  for (int round = 0; round < 3; ++round) {
    State next = state;
    std::vector<Change> changes;
    while (changes.size() < 2) {
      next = state;
      changes = RandomStep(&next, rng);
      changes.erase(std::remove_if(changes.begin(), changes.end(),
                                   [](const Change& c) { return !c.delta || c.delta->count == 0; }),
                    changes.end());
    }
    const weight_sync::Manifest m = ManifestOf(next, 1, 0);
    Request options = DeltaOptions(0, 1, true, ManifestToJson(m));
    std::vector<Request> whole = ::rl::testing::StreamMessages({}, options);  // options alone
    whole.back().clear_end();
    for (Request& r : ::rl::testing::StreamMessages(ChunksOf(changes, rng))) {
      whole.push_back(std::move(r));
    }
    const rl::v1::TensorStreamEnd end = whole.back().end();
    whole.back().clear_end();
    Request end_msg;
    *end_msg.mutable_end() = end;
    whole.push_back(end_msg);
    // Every message index: half-closed there without the end, and cancelled there.
    for (size_t k = 0; k < whole.size(); ++k) {
      SCOPED_TRACE(absl::StrCat("round ", round, ", cut after ", k, " of ", whole.size()));
      const std::vector<Request> prefix(whole.begin(), whole.begin() + static_cast<int64_t>(k));
      rl::v1::AdminResponse resp;
      grpc::Status s = w.Send(prefix, &resp);
      EXPECT_FALSE(s.ok());
      w.ExpectServes(state, 0);
      {
        grpc::ClientContext ctx;
        auto writer = w.admin().UpdateWeightsFromTensor(&ctx, &resp);
        for (const Request& r : prefix) ASSERT_TRUE(writer->Write(r));
        if (k > 0) AwaitStaging(w, true);  // the worker took the slot for this call
        ctx.TryCancel();
        EXPECT_FALSE(writer->Finish().ok());
      }
      AwaitStaging(w, false);
      w.ExpectServes(state, 0);
    }
    // After the end, before the half-close: cancelled.
    {
      rl::v1::AdminResponse resp;
      grpc::ClientContext ctx;
      auto writer = w.admin().UpdateWeightsFromTensor(&ctx, &resp);
      for (const Request& r : whole) ASSERT_TRUE(writer->Write(r));
      AwaitStaging(w, true);
      ctx.TryCancel();
      EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
      AwaitStaging(w, false);
      w.ExpectServes(state, 0);
    }
    // Inside a payload: a chunk cut at a random byte offset, the end counting what was sent.
    {
      SCOPED_TRACE("inside a payload");
      std::vector<rl::v1::TensorChunk> chunks = ChunksOf(changes, rng);
      const size_t i = rng() % chunks.size();
      std::string* data = chunks[i].mutable_data();
      if (data->empty())
        data->push_back('\0');  // an empty payload made one byte long
      else
        data->resize(rng() % data->size());
      rl::v1::AdminResponse resp;
      const grpc::Status s = w.Send(::rl::testing::StreamMessages(chunks, options), &resp);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
      w.ExpectServes(state, 0);
    }
    // The whole stream stages, verified; activation serves it.
    rl::v1::AdminResponse resp;
    grpc::Status s = w.Send(whole, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(w.Info().staged_weights_sha256(), m.sha256);
    rl::v1::DropStagedWeightsRequest drop;
    ASSERT_TRUE(w.Call(&Stub::DropStagedWeights, drop, &resp).ok());
    w.ExpectServes(state, 0);
  }
}

// ---- the tcp group ----

// A worker and a tcp group "train" with this process as rank 0; two_phase(): receives through
// Prepare / Complete, else one ReceiveWeights call.
class DeltaGroupBase : public ::testing::Test {
 protected:
  virtual bool two_phase() const = 0;
  void SetUp() override {
    worker_ = std::make_unique<Worker>(Stories());
    ASSERT_TRUE(worker_->ok());
    Join();
  }
  void TearDown() override {
    if (sender_) sender_->Close();
    worker_.reset();
  }
  // A new group "train": the old one (if any) is left on both sides first.
  void Join() {
    if (sender_) {
      sender_->Close();
      rl::v1::DestroyWeightsUpdateGroupRequest destroy;
      destroy.set_group_name("train");
      rl::v1::AdminResponse resp;
      (void)worker_->Call(&Stub::DestroyWeightsUpdateGroup, destroy, &resp);
    }
    weight_sync::GroupOptions options;
    options.rank = 0;
    options.world_size = 2;
    options.group_name = "train";
    options.timeout = std::chrono::seconds(20);
    auto sender = weight_sync::WeightSender::Create(options);
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = *std::move(sender);
    auto join = std::async(std::launch::async, [this] {
      rl::v1::InitWeightsUpdateGroupRequest init;
      init.set_master_address("127.0.0.1");
      init.set_master_port(sender_->port());
      init.set_rank_offset(1);
      init.set_world_size(2);
      init.set_group_name("train");
      init.set_backend(rl::v1::GROUP_BACKEND_TCP);
      rl::v1::AdminResponse resp;
      return worker_->Call(&Stub::InitWeightsUpdateGroup, init, &resp);
    });
    ASSERT_TRUE(sender_->WaitForReceivers().ok());
    const grpc::Status s = join.get();
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // The buckets of `changes` (one tensor each) as the request lists them and the sender sends.
  struct Wire {
    rl::v1::ReceiveWeightsRequest request;
    std::vector<std::vector<weight_sync::TensorSpec>> specs;
    std::vector<std::vector<absl::Span<const uint8_t>>> data;
  };
  static Wire WireOf(const std::vector<Change>& changes, int64_t parent, int64_t version,
                     bool stage, const std::string& manifest) {
    Wire w;
    w.request.set_group_name("train");
    w.request.set_parent_version(parent);
    w.request.set_weight_version(version);
    w.request.set_stage(stage);
    w.request.set_manifest_json(manifest);
    for (const Change& c : changes) {
      rl::v1::WeightBucket* b = w.request.add_buckets();
      b->add_names(c.name);
      b->add_dtypes(c.tensor.dtype);
      b->add_shapes()->mutable_dims()->Assign(c.tensor.shape.begin(), c.tensor.shape.end());
      b->add_encodings(c.delta ? weight_sync::DeltaEncodingName(c.delta->encoding) : "dense");
      b->add_delta_counts(c.delta ? c.delta->count : 0);
      const std::vector<uint8_t>& data = c.delta ? c.delta->payload : c.tensor.bytes;
      b->add_payload_bytes(static_cast<int64_t>(data.size()));
      if (c.delta) {
        w.specs.push_back({{c.name, "U8", {static_cast<int64_t>(data.size())}}});
      } else {
        w.specs.push_back({{c.name, c.tensor.dtype, c.tensor.shape}});
      }
      w.data.push_back({absl::MakeConstSpan(data)});
    }
    return w;
  }

  // Starts the receive, broadcasts the first `buckets` buckets (all: -1), returns the call's
  // status; with `close_after` the trainer then dies. Two-phase: Prepare (answered once the
  // receive is posted), the broadcast, then Complete with the request's version and stage.
  grpc::Status Receive(const Wire& w, int buckets, bool close_after, rl::v1::AdminResponse* resp) {
    if (two_phase()) return PrepareComplete(w, buckets, close_after, resp);
    auto call = std::async(std::launch::async,
                           [&] { return worker_->Call(&Stub::ReceiveWeights, w.request, resp); });
    const size_t n = buckets < 0 ? w.specs.size() : static_cast<size_t>(buckets);
    for (size_t i = 0; i < n; ++i) {
      if (!sender_->Broadcast(w.specs[i], w.data[i]).ok()) break;
    }
    if (close_after) sender_->Close();
    return call.get();
  }

  static rl::v1::PrepareWeightsUpdateRequest PrepareOf(const Wire& w) {
    rl::v1::PrepareWeightsUpdateRequest prepare;
    prepare.set_group_name(w.request.group_name());
    *prepare.mutable_buckets() = w.request.buckets();
    if (w.request.has_parent_version()) prepare.set_parent_version(w.request.parent_version());
    prepare.set_manifest_json(w.request.manifest_json());
    return prepare;
  }
  grpc::Status Complete(const Wire& w, rl::v1::AdminResponse* resp) {
    rl::v1::CompleteWeightsUpdateRequest complete;
    complete.set_group_name(w.request.group_name());
    if (w.request.has_weight_version()) complete.set_weight_version(w.request.weight_version());
    complete.set_stage(w.request.stage());
    return worker_->Call(&Stub::CompleteWeightsUpdate, complete, resp);
  }
  grpc::Status PrepareComplete(const Wire& w, int buckets, bool close_after,
                               rl::v1::AdminResponse* resp) {
    const grpc::Status prepared = worker_->Call(&Stub::PrepareWeightsUpdate, PrepareOf(w), resp);
    if (!prepared.ok()) return prepared;
    EXPECT_TRUE(resp->ready());
    const size_t n = buckets < 0 ? w.specs.size() : static_cast<size_t>(buckets);
    for (size_t i = 0; i < n; ++i) {
      if (!sender_->Broadcast(w.specs[i], w.data[i]).ok()) break;
    }
    if (close_after) sender_->Close();
    return Complete(w, resp);
  }

  std::unique_ptr<Worker> worker_;
  std::unique_ptr<weight_sync::WeightSender> sender_;
};

// GetParam(): the two-phase Prepare / Complete receive, else one ReceiveWeights call.
class DeltaGroupTest : public DeltaGroupBase, public ::testing::WithParamInterface<bool> {
 protected:
  bool two_phase() const override { return GetParam(); }
};

// The two-phase receive only (what happens between Prepare and Complete).
class DeltaPrepareTest : public DeltaGroupBase {
 protected:
  bool two_phase() const override { return true; }
};

INSTANTIATE_TEST_SUITE_P(Receive, DeltaGroupTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "PrepareComplete" : "OneCall";
                         });

TEST_P(DeltaGroupTest, RandomDeltaReceivesEqualTheDenseState) {
  State state = ReadState(Stories());
  std::mt19937 rng(5);
  for (int step = 1; step <= 6; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const std::vector<Change> changes = RandomStep(&state, rng);
    const bool stage = step % 2 == 1;
    const weight_sync::Manifest m = ManifestOf(state, step, step - 1);
    const Wire w = WireOf(changes, step - 1, step, stage, step % 3 == 0 ? ManifestToJson(m) : "");
    rl::v1::AdminResponse resp;
    grpc::Status s = Receive(w, -1, false, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    if (stage) {
      const rl::v1::GetServerInfoResponse info = worker_->Info();
      EXPECT_EQ(info.staged_source(), "group:train");
      EXPECT_EQ(info.staged_parent_version(), step - 1);
      EXPECT_EQ(worker_->server().weight_version(), step - 1);
      s = worker_->Activate(step);
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
    worker_->ExpectServes(state, step);
  }
  // A parent the worker does not serve: refused before anything is received.
  State next = state;
  const Wire w = WireOf(RandomStep(&next, rng), 2, 9, true, "");
  rl::v1::AdminResponse resp;
  const grpc::Status s = two_phase()
                             ? worker_->Call(&Stub::PrepareWeightsUpdate, PrepareOf(w), &resp)
                             : worker_->Call(&Stub::ReceiveWeights, w.request, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("applies to version 2"), std::string::npos);
  EXPECT_NE(s.error_message().find("serves version 6"), std::string::npos);
  worker_->ExpectServes(state, 6);
}

// Prepared against the served version, then another version is activated before Complete: the
// Complete refuses (naming both versions), applies and stages nothing; the group stays usable.
TEST_F(DeltaPrepareTest, AParentThatMovedBeforeCompleteIsRefused) {
  State state = ReadState(Stories());
  std::mt19937 rng(23);
  for (const bool stage : {false, true}) {
    SCOPED_TRACE(stage ? "stage" : "apply");
    const int64_t served = worker_->server().weight_version();
    State next = state;
    const std::vector<Change> changes = RandomStep(&next, rng);
    Wire w = WireOf(changes, served, served + 2, stage, "");
    rl::v1::AdminResponse resp;
    grpc::Status s = worker_->Call(&Stub::PrepareWeightsUpdate, PrepareOf(w), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    // Another version (the same tensors, whole) is served meanwhile.
    std::vector<Change> whole = changes;
    for (Change& c : whole) c.delta.reset();
    Request bump;
    bump.set_weight_version(served + 1);
    ASSERT_TRUE(
        worker_->Send(::rl::testing::StreamMessages(ChunksOf(whole, rng), bump), &resp).ok());
    state = next;
    for (size_t i = 0; i < w.specs.size(); ++i) {
      ASSERT_TRUE(sender_->Broadcast(w.specs[i], w.data[i]).ok());
    }
    s = Complete(w, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_NE(s.error_message().find(absl::StrCat("its parent is version ", served)),
              std::string::npos)
        << s.error_message();
    EXPECT_NE(s.error_message().find(absl::StrCat("serves version ", served + 1)),
              std::string::npos)
        << s.error_message();
    worker_->ExpectServes(state, served + 1);
  }
  // The group is still in step: a delta of the served version goes through.
  const int64_t served = worker_->server().weight_version();
  const std::vector<Change> changes = RandomStep(&state, rng);  // the wire's spans point here
  const Wire w = WireOf(changes, served, served + 1, false, "");
  rl::v1::AdminResponse resp;
  const grpc::Status s = Receive(w, -1, false, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  worker_->ExpectServes(state, served + 1);
}

// A Complete refused before the received delta is used (a version its manifest does not name)
// keeps the prepared receive: the retry with the right version applies it.
TEST_F(DeltaPrepareTest, ACompleteRefusedEarlyKeepsThePreparedDelta) {
  State state = ReadState(Stories());
  std::mt19937 rng(29);
  const std::vector<Change> changes = RandomStep(&state, rng);
  Wire w = WireOf(changes, 0, 1, false, ManifestToJson(ManifestOf(state, 1, 0)));
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(worker_->Call(&Stub::PrepareWeightsUpdate, PrepareOf(w), &resp).ok());
  for (size_t i = 0; i < w.specs.size(); ++i) {
    ASSERT_TRUE(sender_->Broadcast(w.specs[i], w.data[i]).ok());
  }
  Wire wrong = w;
  wrong.request.set_weight_version(7);
  grpc::Status s = Complete(wrong, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("prepared update is kept"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(worker_->server().weight_version(), 0);
  s = Complete(w, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  worker_->ExpectServes(state, 1);
}

// A delta receive cut anywhere, staged or applied, stages and applies nothing and leaves the
// served weights as they were.
TEST_P(DeltaGroupTest, ADeltaReceiveCutAnywhereChangesNothing) {
  const State state = ReadState(Stories());
  std::mt19937 rng(11);
  State next = state;
  std::vector<Change> changes;
  while (changes.size() < 3) {
    next = state;
    changes = RandomStep(&next, rng);
    for (Change& c : changes) {
      if (!c.delta)
        c.delta = *weight_sync::EncodeDelta(*model_io::ParseDType(c.tensor.dtype),
                                            state.at(c.name).bytes, c.tensor.bytes);
    }
  }
  const std::string manifest = ManifestToJson(ManifestOf(next, 1, 0));
  for (const bool stage : {true, false}) {
    SCOPED_TRACE(stage ? "staged" : "applied");
    const Wire w = WireOf(changes, 0, 1, stage, manifest);
    const std::string nothing = stage ? "nothing is staged" : "nothing was applied";
    // The trainer dies before the first bucket, or after any bucket but the last.
    for (size_t k = 0; k < changes.size(); ++k) {
      SCOPED_TRACE(absl::StrCat("trainer dies after ", k, " buckets"));
      rl::v1::AdminResponse resp;
      const grpc::Status s = Receive(w, static_cast<int>(k), true, &resp);
      EXPECT_FALSE(s.ok());
      EXPECT_NE(s.error_message().find(nothing), std::string::npos) << s.error_message();
      worker_->ExpectServes(state, 0);
      Join();
    }
    // A payload cut at a random byte offset (the bucket no longer matches what was announced), and
    // a corrupted one (a flipped byte: refused when applied or verified).
    for (int round = 0; round < 4; ++round) {
      SCOPED_TRACE(absl::StrCat("payload round ", round));
      std::vector<std::vector<uint8_t>> payloads;
      for (const Change& c : changes) payloads.push_back(c.delta->payload);
      const size_t i = rng() % payloads.size();
      Wire cut = w;
      if (payloads[i].empty()) payloads[i].push_back(0);
      if (round % 2 == 0) {
        payloads[i].resize(rng() % payloads[i].size());
      } else {
        payloads[i][rng() % payloads[i].size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      }
      cut.specs[i] = {{changes[i].name, "U8", {static_cast<int64_t>(payloads[i].size())}}};
      for (size_t j = 0; j < payloads.size(); ++j) cut.data[j] = {absl::MakeConstSpan(payloads[j])};
      rl::v1::AdminResponse resp;
      const grpc::Status s =
          Receive(cut, round % 2 == 0 ? static_cast<int>(i) + 1 : -1, round % 2 == 0, &resp);
      EXPECT_FALSE(s.ok());
      worker_->ExpectServes(state, 0);
      Join();
    }
  }
  const Wire w = WireOf(changes, 0, 1, true, manifest);
  // The whole receive stages, verified against its manifest.
  rl::v1::AdminResponse resp;
  const grpc::Status s = Receive(w, -1, false, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(worker_->Info().staged_weights_sha256(), ManifestOf(next, 1, 0).sha256);
  ASSERT_TRUE(worker_->Activate(1).ok());
  worker_->ExpectServes(next, 1);
}

}  // namespace
}  // namespace rl::worker::testing
