// SubscribeKvEvents on an in-process worker (services/worker/sglang/kv_events_reactor.h): the
// snapshot (a clear, then every cached block) and live batches as the SMG gateway reads them,
// numbered from 1 without gaps; the blocks' tokens are what the model saw, chained by hash; a
// resume cursor is OUT_OF_RANGE; the data-plane key guards it; shutdown ends subscriptions.
#include "services/worker/sglang/kv_events_reactor.h"

#include <set>
#include <thread>

#include "gmock/gmock.h"
#include "services/worker/engine/radix_cache.h"
#include "sglang_scheduler.grpc.pb.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker {
namespace {

using ::testing::HasSubstr;
namespace common = ::smg::grpc::common;
namespace sgl = ::sglang::grpc::scheduler;

// A subscriber's view of one worker: every stored block (hash → tokens), batches in order.
struct Subscriber {
  std::map<int64_t, std::vector<uint32_t>> blocks;
  uint64_t last_sequence = 0;
  int clears = 0;

  void Apply(const common::KvEventBatch& b, int page) {
    EXPECT_EQ(b.sequence_number(), last_sequence + 1);
    last_sequence = b.sequence_number();
    EXPECT_GT(b.timestamp(), 0);
    for (const common::KvCacheEvent& e : b.events()) {
      if (e.has_cleared()) {
        blocks.clear();
        ++clears;
      } else if (e.has_removed()) {
        for (int64_t h : e.removed().block_hashes()) EXPECT_EQ(blocks.erase(h), 1u);
      } else if (e.has_stored()) {
        const auto& st = e.stored();
        uint64_t parent = 0;
        bool has_parent = st.has_parent_block_hash();
        if (has_parent) {
          EXPECT_TRUE(blocks.count(st.parent_block_hash()));
          parent = static_cast<uint64_t>(st.parent_block_hash());
        }
        for (const common::KvBlock& block : st.blocks()) {
          EXPECT_EQ(block.block_size(), page);
          ASSERT_EQ(block.token_ids_size(), page);
          std::vector<int32_t> tokens(block.token_ids().begin(), block.token_ids().end());
          if (has_parent) {
            EXPECT_EQ(block.block_hash(),
                      static_cast<int64_t>(engine::RadixCache::BlockHash(parent, tokens)));
          }
          blocks[block.block_hash()] =
              std::vector<uint32_t>(block.token_ids().begin(), block.token_ids().end());
          parent = static_cast<uint64_t>(block.block_hash());
          has_parent = true;
        }
      }
    }
  }
};

class KvEventsReactorTest : public testing::WorkerFixture {
 protected:
  void SetUp() override {
    WorkerConfig config;
    config.page_size = 4;
    StartWorker(config);
    sglang_ = sgl::SglangScheduler::NewStub(channel_);
  }

  std::unique_ptr<sgl::SglangScheduler::Stub> sglang_;
};

TEST_F(KvEventsReactorTest, SnapshotThenLiveBatches) {
  rl::v1::GenerateFinal f;
  // Cached before the subscription: arrives in the snapshot.
  ASSERT_TRUE(Generate(Greedy(testing::kPromptIds, 12), &f).ok());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  common::SubscribeKvEventsRequest req;
  auto reader = sglang_->SubscribeKvEvents(&ctx, req);
  Subscriber sub;
  common::KvEventBatch batch;
  ASSERT_TRUE(reader->Read(&batch));
  sub.Apply(batch, 4);
  EXPECT_EQ(sub.clears, 1);
  ASSERT_FALSE(sub.blocks.empty());
  // The prompt's first page is a block with the prompt's tokens.
  std::set<std::vector<uint32_t>> contents;
  for (const auto& [h, t] : sub.blocks) contents.insert(t);
  const std::vector<uint32_t> first_page(testing::kPromptIds.begin(),
                                         testing::kPromptIds.begin() + 4);
  EXPECT_TRUE(contents.count(first_page));
  const size_t before = sub.blocks.size();
  // A new prompt: its blocks come live.
  std::vector<int32_t> other = {1, 300, 301, 302, 303, 304, 305, 306, 307, 308};
  ASSERT_TRUE(Generate(Greedy(other, 8), &f).ok());
  while (sub.blocks.size() < before + 4) {
    ASSERT_TRUE(reader->Read(&batch));
    sub.Apply(batch, 4);
  }
  // A flush clears.
  rl::v1::AdminResponse flushed;
  grpc::ClientContext fctx;
  ASSERT_TRUE(admin_->FlushCache(&fctx, {}, &flushed).ok());
  while (sub.clears < 2) {
    ASSERT_TRUE(reader->Read(&batch));
    sub.Apply(batch, 4);
  }
  EXPECT_TRUE(sub.blocks.empty());
  ctx.TryCancel();
  while (reader->Read(&batch)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(KvEventsReactorTest, AResumeCursorIsOutOfRange) {
  grpc::ClientContext ctx;
  common::SubscribeKvEventsRequest req;
  req.set_start_sequence_number(7);
  auto reader = sglang_->SubscribeKvEvents(&ctx, req);
  common::KvEventBatch batch;
  EXPECT_FALSE(reader->Read(&batch));
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(s.error_message(), HasSubstr("subscribe from 0"));
}

TEST_F(KvEventsReactorTest, ManySubscribersComeAndGo) {
  for (int round = 0; round < 3; ++round) {
    std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
    std::vector<std::unique_ptr<grpc::ClientReader<common::KvEventBatch>>> readers;
    for (int i = 0; i < 4; ++i) {
      ctxs.push_back(std::make_unique<grpc::ClientContext>());
      readers.push_back(sglang_->SubscribeKvEvents(ctxs.back().get(), {}));
      common::KvEventBatch batch;
      ASSERT_TRUE(readers.back()->Read(&batch));  // the snapshot
      EXPECT_EQ(batch.sequence_number(), 1u);
    }
    rl::v1::GenerateFinal f;
    ASSERT_TRUE(Generate(Greedy(testing::kPromptIds, 4 + round), &f).ok());
    for (auto& c : ctxs) c->TryCancel();
    for (auto& r : readers) {
      common::KvEventBatch batch;
      while (r->Read(&batch)) {
      }
      (void)r->Finish();
    }
  }
  // Every subscription is gone: the engine records nothing any more.
  for (int i = 0; i < 200 && server_->engine().kv_events().num_subscribers() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->engine().kv_events().num_subscribers(), 0u);
}

TEST_F(KvEventsReactorTest, TheDataKeyGuardsIt) {
  WorkerConfig config;
  config.api_key = "k";
  server_->Shutdown();
  server_.reset();
  StartWorker(config);
  sglang_ = sgl::SglangScheduler::NewStub(channel_);
  grpc::ClientContext ctx;
  auto reader = sglang_->SubscribeKvEvents(&ctx, {});
  common::KvEventBatch batch;
  EXPECT_FALSE(reader->Read(&batch));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext keyed;
  keyed.AddMetadata("authorization", "Bearer k");
  auto ok = sglang_->SubscribeKvEvents(&keyed, {});
  EXPECT_TRUE(ok->Read(&batch));
  keyed.TryCancel();
  while (ok->Read(&batch)) {
  }
  (void)ok->Finish();
}

TEST_F(KvEventsReactorTest, ShutdownEndsSubscriptionsInsteadOfWaitingForThem) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = sglang_->SubscribeKvEvents(&ctx, {});
  common::KvEventBatch batch;
  ASSERT_TRUE(reader->Read(&batch));  // the snapshot: subscribed
  server_->Shutdown();
  while (reader->Read(&batch)) {
  }
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("shutting down"));  // not the drain's cancellation
}

}  // namespace
}  // namespace rl::worker
