// SubscribeKvEvents of SGLang's scheduler protocol on the worker: one reactor per subscription
// streams the engine's KV cache events (engine/kv_events.h) as smg.grpc.common.KvEventBatch
// messages: first a snapshot (a clear, then every cached block, parents first), then a batch per
// engine step that stored, removed or cleared blocks. Blocks are the engine's KV pages
// (block_size = --page-size), with chained hashes; sequence numbers count this stream's
// messages from 1, so a subscription asking to resume (start_sequence_number > 0) is refused
// OUT_OF_RANGE (the worker keeps no replay history: subscribe from 0 for a snapshot, as the SMG
// gateway then does), and a subscriber that falls behind the worker's bounded buffer ends
// DATA_LOSS (the gateway clears the worker's blocks and subscribes again). docs/kv-events.md.
//
// Cost: the subscription is made on `executor` (it waits for the engine thread, at most one
// step); batches are converted and written on gRPC's threads, at most kMaxBatchesPerTake held at
// once per stream; the engine thread only appends to the log and sets an alarm.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/bounded_executor.h"
#include "grpcpp/support/server_callback.h"
#include "services/worker/engine/engine.h"
#include "sglang_scheduler.grpc.pb.h"

namespace rl::worker {

// Most tokens + hashes in one message (snapshot parts; live batches are one engine step each).
inline constexpr size_t kMaxKvEventMessageUnits = 1 << 16;

// A new reactor for one SubscribeKvEvents call (it deletes itself when done). `auth` is the key
// check's outcome; `engine` and `executor` must outlive the call.
grpc::ServerWriteReactor<::smg::grpc::common::KvEventBatch>* StartKvEvents(
    engine::Engine* engine, BoundedExecutor* executor, int32_t page_size, const absl::Status& auth,
    const ::smg::grpc::common::SubscribeKvEventsRequest& request);

// One batch as the gateway reads it (tests use it too).
void FillKvEventBatch(const engine::KvEventBatch& batch, int32_t page_size, uint64_t sequence,
                      ::smg::grpc::common::KvEventBatch* out);

}  // namespace rl::worker
