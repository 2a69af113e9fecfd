// KV cache events: what the radix cache stores, removes and clears, in whole pages ("blocks"),
// for subscribers outside the engine (SGLang's SubscribeKvEvents, which the SMG gateway's
// cache-aware policy reads). A block's hash chains its page's tokens onto its parent block's
// hash (and the weight-version namespace at the root), so it names one position of one token
// sequence; docs/kv-events.md has the protocol.
//
// KvEventLog is the bounded buffer between the engine thread and the subscribers: the engine
// appends one batch per step (O(events), one short mutex hold, never waiting for a subscriber);
// batches past `max_units` buffered units (tokens + hashes) are dropped oldest first, and a
// subscriber that had not read them is told so (DATA_LOSS: resubscribe for a fresh snapshot),
// so a slow subscriber never holds the engine or unbounded memory. Each subscription starts with
// a snapshot of the cache (a clear, then every block, parents first) taken on the engine thread,
// so snapshot and live batches join without gap or overlap. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace rl::engine {

struct KvCacheEvent {
  enum class Kind { kStored, kRemoved, kCleared };
  Kind kind = Kind::kStored;
  // kStored: the blocks' parent (the block before the first one), when it is not the root.
  bool has_parent = false;
  int64_t parent_hash = 0;
  // kStored: one hash per block, in order; kRemoved: the removed blocks' hashes.
  std::vector<int64_t> hashes;
  // kStored: the blocks' tokens, page_size per block.
  std::vector<int32_t> tokens;

  // What the event costs in the log's bound.
  size_t units() const { return hashes.size() + tokens.size() + 1; }
};

struct KvEventBatch {
  uint64_t seq = 0;   // the log's numbering (0 for snapshot parts)
  double unix_s = 0;  // when the engine published it
  std::vector<KvCacheEvent> events;
  size_t units = 0;
};

class KvEventLog : public std::enable_shared_from_this<KvEventLog> {
 public:
  // One subscriber's view: its snapshot, then every batch appended after it subscribed.
  class Subscription {
   public:
    ~Subscription();  // unsubscribes
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;

    // Appends to `out` what the subscriber reads next, at most `max_batches`: the snapshot's
    // parts first (at most `max_units` each), then live batches in order. Empty when nothing is
    // new: `notify` runs once something is. DATA_LOSS when the log dropped batches it had not
    // read (it fell behind by more than the log's bound); UNAVAILABLE once the log is closed.
    absl::Status Take(size_t max_batches, size_t max_units,
                      std::vector<std::shared_ptr<const KvEventBatch>>* out);

   private:
    friend class KvEventLog;
    Subscription(std::shared_ptr<KvEventLog> log, std::function<void()> notify)
        : log_(std::move(log)), notify_(std::move(notify)) {}

    const std::shared_ptr<KvEventLog> log_;
    const std::function<void()> notify_;
    // Under the log's mutex:
    std::vector<KvCacheEvent> snapshot_;
    double snapshot_unix_s_ = 0;  // when it was taken
    size_t snapshot_next_ = 0;
    uint64_t next_seq_ = 0;
    bool waiting_ = false;
  };

  // `max_units`: tokens + hashes buffered at most (the newest batch is always kept).
  static std::shared_ptr<KvEventLog> Create(size_t max_units, size_t max_subscribers);

  // ---- engine thread ----
  // Whether anyone listens (the engine records events only then).
  bool active() const;
  // Publishes one batch of events (none: nothing); wakes waiting subscribers.
  void Append(std::vector<KvCacheEvent> events, double unix_s);
  // Adds a subscriber whose first reads are `snapshot`, then what Append publishes from now on.
  // `notify` runs (under the log's lock: it must only schedule work, never call back) when a
  // Take that found nothing can find something. RESOURCE_EXHAUSTED past max_subscribers,
  // UNAVAILABLE after Close.
  absl::StatusOr<std::unique_ptr<Subscription>> Subscribe(std::vector<KvCacheEvent> snapshot,
                                                          std::function<void()> notify);

  // ---- any thread ----
  // Ends every subscription (its next Take is UNAVAILABLE: the worker shuts down; waiting ones
  // are notified) and refuses new ones, so no subscriber holds a server's drain. Idempotent.
  void Close();

  size_t max_units() const { return max_units_; }
  size_t buffered_units() const;
  size_t num_subscribers() const;

 private:
  KvEventLog(size_t max_units, size_t max_subscribers)
      : max_units_(max_units), max_subscribers_(max_subscribers) {}
  void Remove(Subscription* s);
  // Drops the batches every subscriber has read (all of them when none subscribes).
  void DropReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_units_;
  const size_t max_subscribers_;
  mutable absl::Mutex mu_;
  std::deque<std::shared_ptr<const KvEventBatch>> batches_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;  // of the next Append
  size_t units_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Subscription*> subscribers_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace rl::engine
