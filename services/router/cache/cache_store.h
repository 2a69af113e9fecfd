// CacheStore: the durable copy of the router's text cache (and of the few fleet facts a restart
// must not forget) in one SQLite database, `DIR/router-state.sqlite3`. Why SQLite (Debian's
// libsqlite3): a crash-safe embedded store (write-ahead log, synchronous=FULL: a committed
// transaction survives SIGKILL and power loss) with a hard size bound (max_page_count: a full
// store refuses a transaction and rolls it back whole, never half-written), freed pages reused
// whatever the record size (LMDB's large values need contiguous free runs), no background
// compaction threads or write stalls (RocksDB), and a file an operator can open with `sqlite3`.
//
// Design: the cache mirrors every node it changes (new edge, split, version bump, trajectory
// end, removal) into a StoreBatch under its own writer lock and Enqueue()s it there, so batches
// reach the store in the order the tree changed. One committer thread drains the queue: every
// batch queued since its last commit goes into ONE transaction (group commit), so the fsync
// cost is shared by all the inserts that arrived meanwhile. A response that carries an insert
// completes only after WhenDurable(ticket) fires (Durable semantics: every batch up to the
// ticket is on disk). If a commit fails (disk full, I/O error) the store stops: it keeps its
// last committed state (a consistent past of the tree), every ticket fails until it recovers,
// and the router says so in its answers (or refuses text prompts: --cache-store-failure); it
// never writes a batch after a lost one. Recovery: every retry_interval the committer asks the
// cache for a snapshot of the whole tree (SetResync / EnqueueSnapshot) and writes it in one
// transaction in place of every stored node; once that commits the store works again (cost: the
// whole cache copied and written once per attempt while the disk is still full).
//
// Tables: nodes(id INTEGER PRIMARY KEY, rec BLOB) (the record format is the cache's),
// meta(key TEXT PRIMARY KEY, value BLOB). Cost: one transaction per commit, O(bytes changed);
// recovery reads every row once.
//
// Thread safety: every method may be called concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

struct sqlite3;

namespace rl::router {

struct CacheStoreOptions {
  // Folder of the database (created when missing).
  std::string dir;
  // Bound on the database and its write-ahead log together. >= 1 MiB.
  int64_t max_disk_bytes = int64_t{8} << 30;
  // After a failed commit, how often the store tries to write the whole cache again (Resync).
  std::chrono::milliseconds retry_interval{2000};

  absl::Status Validate() const;
};

// One mutation's changes, applied in one piece and in Enqueue order.
struct StoreBatch {
  std::vector<std::pair<uint64_t, std::string>> puts;  // node id -> record
  std::vector<uint64_t> deletes;
  std::vector<std::pair<std::string, std::string>> meta;  // key -> value
  // A snapshot of the whole cache (EnqueueSnapshot): every stored node is replaced by `puts`.
  bool replace_all = false;

  bool empty() const { return puts.empty() && deletes.empty() && meta.empty(); }
  size_t bytes() const;
};

struct CacheStoreStats {
  int64_t commits = 0;        // transactions
  int64_t batches = 0;        // batches committed (>= commits: grouped)
  int64_t bytes_written = 0;  // record bytes
  int64_t disk_bytes = 0;     // database + WAL file sizes after the last commit
  int64_t max_disk_bytes = 0;
  int64_t pending_batches = 0;  // queued, not yet committed
  bool failed = false;          // a commit failed: nothing is written until a resync succeeds
  std::string failure;          // why
  int64_t failures = 0;         // commits that failed (resyncs included)
  int64_t recoveries = 0;       // resyncs that brought the store back
  int64_t retry_interval_ms = 0;
};

class CacheStore {
 public:
  // Opens (or creates) DIR/router-state.sqlite3 and starts the committer. FailedPrecondition
  // naming the file when it cannot be opened, is not ours or is corrupt.
  static absl::StatusOr<std::unique_ptr<CacheStore>> Open(const CacheStoreOptions& options);
  // Commits what is queued, then stops the committer.
  ~CacheStore();
  CacheStore(const CacheStore&) = delete;
  CacheStore& operator=(const CacheStore&) = delete;

  const std::string& path() const { return path_; }

  // Recovery (before the store takes batches): calls `fn` for every node record, in id order.
  // Stops at the first error `fn` returns.
  absl::Status ForEachNode(const std::function<absl::Status(uint64_t, std::string_view)>& fn);
  absl::StatusOr<std::optional<std::string>> GetMeta(const std::string& key);
  // Writes one meta value durably now (blocking; the fleet state, outside the cache's batches).
  absl::Status PutMeta(const std::string& key, const std::string& value);

  // Queues `batch` and returns its ticket (increasing). Call under the lock that orders the
  // changes. Cheap: a move and a notify.
  uint64_t Enqueue(StoreBatch batch) ABSL_LOCKS_EXCLUDED(mu_);
  // The ticket of the last batch queued (0 before any): waiting for it covers every change
  // made before this call.
  uint64_t last_ticket() const ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `done` once every batch up to `ticket` is committed (OK) or can no longer be (the
  // store failed: the error). Runs inline when that is known already, else on the committer
  // thread: `done` must not block.
  void WhenDurable(uint64_t ticket, absl::AnyInvocable<void(absl::Status) &&> done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Blocking form of WhenDurable.
  absl::Status WaitDurable(uint64_t ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the database is over 7/8 of its page budget (the cache collects garbage early).
  bool near_full() const;

  // Recovery from a failed commit. `resync` (called on the committer thread, at most every
  // retry_interval while the store has failed, never with the store's locks held) must take the
  // lock that orders the cache's changes and call EnqueueSnapshot with the whole cache. Set it
  // once the cache is recovered; null stops the calls (before the cache goes; waits for a call
  // in progress).
  void SetResync(std::function<void()> resync) ABSL_LOCKS_EXCLUDED(resync_mu_);
  // Queues `snapshot` (the whole cache; replace_all is set here) in place of every batch not
  // yet written: once committed, the store holds the cache as it was at this call (every later
  // batch follows it) plus the latest value of every meta key ever queued, and works again.
  // Call under the lock that orders the changes.
  void EnqueueSnapshot(StoreBatch snapshot) ABSL_LOCKS_EXCLUDED(mu_);

  CacheStoreStats GetStats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CacheStore() = default;
  void CommitLoop();
  absl::Status Commit(const std::deque<StoreBatch>& batches);
  absl::Status Exec(const char* sql);
  int64_t DiskBytes() const;

  std::string path_;
  int64_t max_disk_bytes_ = 0;
  int64_t max_pages_ = 0;
  int lock_fd_ = -1;       // flock'd: one process per folder
  sqlite3* db_ = nullptr;  // used by the committer only once it runs (and by recovery before)
  std::thread committer_;
  std::atomic<bool> near_full_{false};

  mutable absl::Mutex mu_;
  std::deque<StoreBatch> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t durable_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::multimap<uint64_t, absl::AnyInvocable<void(absl::Status) &&>> waiters_ ABSL_GUARDED_BY(mu_);
  CacheStoreStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Mutex db_mu_;  // serializes the connection between PutMeta and the committer
  std::chrono::milliseconds retry_interval_{2000};
  // The latest value of every meta key queued (small: a few keys): a snapshot rewrites them.
  std::map<std::string, std::string> meta_latest_ ABSL_GUARDED_BY(mu_);
  bool resync_queued_ ABSL_GUARDED_BY(mu_) = false;  // a snapshot waits in queue_
  absl::Mutex resync_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::function<void()> resync_ ABSL_GUARDED_BY(resync_mu_);
};

}  // namespace rl::router
