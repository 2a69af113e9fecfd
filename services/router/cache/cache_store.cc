#include "services/router/cache/cache_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string_view>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace rl::router {
namespace {

constexpr const char* kFileName = "router-state.sqlite3";
constexpr int64_t kPageSize = 4096;
constexpr int64_t kMinDiskBytes = int64_t{1} << 20;

// Finalizes a statement on every path.
struct Stmt {
  sqlite3_stmt* s = nullptr;
  ~Stmt() { sqlite3_finalize(s); }
};

int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

}  // namespace

absl::Status CacheStoreOptions::Validate() const {
  if (dir.empty()) return absl::InvalidArgumentError("--cache-dir: must not be empty");
  if (max_disk_bytes < kMinDiskBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-cache-disk-bytes: must be >= ", kMinDiskBytes, ", got ", max_disk_bytes));
  }
  if (retry_interval.count() <= 0) {
    return absl::InvalidArgumentError("cache store retry interval: must be > 0");
  }
  return absl::OkStatus();
}

size_t StoreBatch::bytes() const {
  size_t n = deletes.size() * 8;
  for (const auto& [id, rec] : puts) n += 8 + rec.size();
  for (const auto& [k, v] : meta) n += k.size() + v.size();
  return n;
}

absl::Status CacheStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status s = absl::FailedPreconditionError(
        absl::StrCat(path_, ": ", sql, ": ", err != nullptr ? err : sqlite3_errmsg(db_)));
    sqlite3_free(err);
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CacheStore>> CacheStore::Open(const CacheStoreOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--cache-dir ", options.dir, ": cannot create: ", ec.message()));
  }
  std::unique_ptr<CacheStore> store(new CacheStore());
  store->path_ = (std::filesystem::path(options.dir) / kFileName).string();
  // One router per store: a second one over the same folder would interleave its batches.
  const std::string lock_path = store->path_ + ".lock";
  store->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (store->lock_fd_ < 0 || ::flock(store->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--cache-dir ", options.dir, ": ", lock_path,
                     " is locked by another process (another rl-router uses this folder?)"));
  }
  store->max_disk_bytes_ = options.max_disk_bytes;
  store->retry_interval_ = options.retry_interval;
  // The database gets 3/4 of the bound, the write-ahead log (checkpointed and truncated by the
  // commit that finds it over 1/8 of the bound or 64 MiB) the rest.
  store->max_pages_ = options.max_disk_bytes * 3 / 4 / kPageSize;
  if (sqlite3_open_v2(store->path_.c_str(), &store->db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    std::string why = store->db_ != nullptr ? sqlite3_errmsg(store->db_) : "out of memory";
    return absl::FailedPreconditionError(absl::StrCat(store->path_, ": cannot open: ", why));
  }
  sqlite3_extended_result_codes(store->db_, 1);
  const std::string pragmas = absl::StrCat(
      "PRAGMA page_size=", kPageSize,
      "; PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA wal_autocheckpoint=0;"
      // 32 MiB of page cache (the default is 2 MiB): a commit's B-tree updates stay in memory.
      " PRAGMA cache_size=-32768;"
      " PRAGMA max_page_count=",
      store->max_pages_,
      ";"
      " CREATE TABLE IF NOT EXISTS nodes(id INTEGER PRIMARY KEY, rec BLOB NOT NULL);"
      " CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value BLOB NOT NULL);");
  if (absl::Status s = store->Exec(pragmas.c_str()); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(s.message(), " (move the folder away to start with an empty cache)"));
  }
  // A database over the (possibly lowered) bound still opens: it shrinks as GC frees pages.
  Stmt quick;
  if (sqlite3_prepare_v2(store->db_, "PRAGMA quick_check", -1, &quick.s, nullptr) != SQLITE_OK ||
      sqlite3_step(quick.s) != SQLITE_ROW ||
      std::string_view(reinterpret_cast<const char*>(sqlite3_column_text(quick.s, 0))) != "ok") {
    return absl::FailedPreconditionError(
        absl::StrCat(store->path_,
                     ": the database is corrupt (PRAGMA quick_check); move the folder away to "
                     "start with an empty cache"));
  }
  {
    absl::MutexLock lock(&store->mu_);
    store->stats_.max_disk_bytes = options.max_disk_bytes;
    store->stats_.retry_interval_ms = options.retry_interval.count();
    store->stats_.disk_bytes = store->DiskBytes();
  }
  store->committer_ = std::thread([s = store.get()] { s->CommitLoop(); });
  return store;
}

CacheStore::~CacheStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (committer_.joinable()) committer_.join();
  if (db_ != nullptr) sqlite3_close_v2(db_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

int64_t CacheStore::DiskBytes() const { return FileSize(path_) + FileSize(path_ + "-wal"); }

absl::Status CacheStore::ForEachNode(
    const std::function<absl::Status(uint64_t, std::string_view)>& fn) {
  absl::MutexLock lock(&db_mu_);
  Stmt st;
  if (sqlite3_prepare_v2(db_, "SELECT id, rec FROM nodes ORDER BY id", -1, &st.s, nullptr) !=
      SQLITE_OK) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": ", sqlite3_errmsg(db_)));
  }
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
    const auto id = static_cast<uint64_t>(sqlite3_column_int64(st.s, 0));
    const void* blob = sqlite3_column_blob(st.s, 1);
    const int n = sqlite3_column_bytes(st.s, 1);
    absl::Status s =
        fn(id, std::string_view(static_cast<const char*>(blob), static_cast<size_t>(n)));
    if (!s.ok()) return s;
  }
  if (rc != SQLITE_DONE) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": ", sqlite3_errmsg(db_)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> CacheStore::GetMeta(const std::string& key) {
  absl::MutexLock lock(&db_mu_);
  Stmt st;
  if (sqlite3_prepare_v2(db_, "SELECT value FROM meta WHERE key = ?", -1, &st.s, nullptr) !=
      SQLITE_OK) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": ", sqlite3_errmsg(db_)));
  }
  sqlite3_bind_text(st.s, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
  const int rc = sqlite3_step(st.s);
  if (rc == SQLITE_DONE) return std::optional<std::string>();
  if (rc != SQLITE_ROW) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": ", sqlite3_errmsg(db_)));
  }
  const void* blob = sqlite3_column_blob(st.s, 0);
  const int n = sqlite3_column_bytes(st.s, 0);
  return std::optional<std::string>(
      std::string(static_cast<const char*>(blob), static_cast<size_t>(n)));
}

absl::Status CacheStore::PutMeta(const std::string& key, const std::string& value) {
  StoreBatch batch;
  batch.meta.emplace_back(key, value);
  return WaitDurable(Enqueue(std::move(batch)));
}

uint64_t CacheStore::Enqueue(StoreBatch batch) {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, value] : batch.meta) meta_latest_[key] = value;
  queue_.push_back(std::move(batch));
  return ++enqueued_;
}

void CacheStore::EnqueueSnapshot(StoreBatch snapshot) {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, value] : snapshot.meta) meta_latest_[key] = value;
  snapshot.meta.assign(meta_latest_.begin(), meta_latest_.end());
  snapshot.replace_all = true;
  // Every batch not yet written is in the snapshot already (it was taken after them).
  queue_.clear();
  queue_.push_back(std::move(snapshot));
  resync_queued_ = true;
  ++enqueued_;
}

void CacheStore::SetResync(std::function<void()> resync) {
  absl::MutexLock lock(&resync_mu_);
  resync_ = std::move(resync);
}

uint64_t CacheStore::last_ticket() const {
  absl::MutexLock lock(&mu_);
  return enqueued_;
}

void CacheStore::WhenDurable(uint64_t ticket, absl::AnyInvocable<void(absl::Status) &&> done) {
  absl::Status now;
  {
    absl::MutexLock lock(&mu_);
    if (ticket > durable_ && failure_.ok()) {
      waiters_.emplace(ticket, std::move(done));
      return;
    }
    now = ticket <= durable_ ? absl::OkStatus() : failure_;
  }
  std::move(done)(now);
}

absl::Status CacheStore::WaitDurable(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ticket <= durable_ || !failure_.ok();
  };
  mu_.Await(absl::Condition(&ready));
  return ticket <= durable_ ? absl::OkStatus() : failure_;
}

bool CacheStore::near_full() const { return near_full_.load(std::memory_order_relaxed); }

CacheStoreStats CacheStore::GetStats() const {
  absl::MutexLock lock(&mu_);
  CacheStoreStats s = stats_;
  s.pending_batches = static_cast<int64_t>(queue_.size());
  s.failed = !failure_.ok();
  s.failure = std::string(failure_.message());
  return s;
}

absl::Status CacheStore::Commit(const std::deque<StoreBatch>& batches) {
  absl::MutexLock lock(&db_mu_);
  const auto fail = [this](const char* what) {
    return absl::UnavailableError(absl::StrCat("text cache store ", path_, ": ", what, ": ",
                                               sqlite3_errmsg(db_), " (code ",
                                               sqlite3_extended_errcode(db_), ")"));
  };
  Stmt put, del, meta;
  if (sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO nodes(id, rec) VALUES(?, ?)", -1, &put.s,
                         nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db_, "DELETE FROM nodes WHERE id = ?", -1, &del.s, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)", -1, &meta.s,
                         nullptr) != SQLITE_OK) {
    return fail("prepare");
  }
  if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return fail("begin");
  }
  // Group commit: only the last operation on each node id and meta key of the whole group is
  // written (a node changed by many inserts, e.g. a shared prefix whose version moves, is written
  // once), nodes in id order (B-tree locality). A snapshot supersedes everything before it.
  size_t first = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (batches[i].replace_all) first = i;
  }
  std::map<uint64_t, const std::string*> nodes;  // null: delete
  std::map<std::string_view, const std::string*> metas;
  for (size_t i = first; i < batches.size(); ++i) {
    const StoreBatch& b = batches[i];
    for (uint64_t id : b.deletes) nodes[id] = nullptr;
    for (const auto& [id, rec] : b.puts) nodes[id] = &rec;
    for (const auto& [key, value] : b.meta) metas[key] = &value;
  }
  absl::Status status;
  if (batches[first].replace_all &&
      sqlite3_exec(db_, "DELETE FROM nodes", nullptr, nullptr, nullptr) != SQLITE_OK) {
    status = fail("delete all");
  }
  for (const auto& [id, rec] : nodes) {
    if (!status.ok()) break;
    sqlite3_stmt* st = rec != nullptr ? put.s : del.s;
    sqlite3_bind_int64(st, 1, static_cast<sqlite3_int64>(id));
    if (rec != nullptr) {
      sqlite3_bind_blob(st, 2, rec->data(), static_cast<int>(rec->size()), SQLITE_STATIC);
    }
    if (sqlite3_step(st) != SQLITE_DONE) status = fail(rec != nullptr ? "insert" : "delete");
    sqlite3_reset(st);
  }
  for (const auto& [key, value] : metas) {
    if (!status.ok()) break;
    sqlite3_bind_text(meta.s, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_blob(meta.s, 2, value->data(), static_cast<int>(value->size()), SQLITE_STATIC);
    if (sqlite3_step(meta.s) != SQLITE_DONE) status = fail("meta");
    sqlite3_reset(meta.s);
  }
  if (!status.ok()) {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return status;
  }
  if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    absl::Status s = fail("commit");
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return s;
  }
  // Bound the log: move it into the database and truncate it once it holds 1/8 of the bound.
  if (FileSize(path_ + "-wal") > std::min<int64_t>(max_disk_bytes_ / 8, int64_t{64} << 20)) {
    sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_TRUNCATE, nullptr, nullptr);
  }
  Stmt pages;
  if (sqlite3_prepare_v2(db_,
                         "SELECT (SELECT page_count FROM pragma_page_count()) - "
                         "(SELECT freelist_count FROM pragma_freelist_count())",
                         -1, &pages.s, nullptr) == SQLITE_OK &&
      sqlite3_step(pages.s) == SQLITE_ROW) {
    near_full_.store(sqlite3_column_int64(pages.s, 0) * 8 > max_pages_ * 7,
                     std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

void CacheStore::CommitLoop() {
  while (true) {
    std::deque<StoreBatch> batches;
    uint64_t upto;
    bool resync = false;
    {
      absl::MutexLock lock(&mu_);
      if (!failure_.ok() && !resync_queued_) {
        // Failed: nothing is written after a lost batch. Every retry interval, ask the cache for
        // a snapshot of the whole tree (it replaces what is stored).
        queue_.clear();
        auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
        mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::FromChrono(retry_interval_));
        if (stopping_) return;
        resync = true;
      } else {
        auto work = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stopping_; };
        mu_.Await(absl::Condition(&work));
        if (queue_.empty()) return;  // stopping, nothing left
        batches.swap(queue_);
        upto = enqueued_;
        resync_queued_ = false;
      }
    }
    if (resync) {
      absl::MutexLock lock(&resync_mu_);
      if (resync_) resync_();  // EnqueueSnapshot
      continue;
    }
    size_t bytes = 0;
    for (const StoreBatch& b : batches) bytes += b.bytes();
    const absl::Status s = Commit(batches);
    const int64_t disk = DiskBytes();
    std::vector<absl::AnyInvocable<void(absl::Status) &&>> ready;
    absl::Status result;
    {
      absl::MutexLock lock(&mu_);
      if (s.ok()) {
        if (!failure_.ok()) {
          ++stats_.recoveries;
          spdlog::info("text cache store {} recovered: the whole cache is persisted again", path_);
        }
        failure_ = absl::OkStatus();
        durable_ = upto;
        ++stats_.commits;
        stats_.batches += static_cast<int64_t>(batches.size());
        stats_.bytes_written += static_cast<int64_t>(bytes);
      } else {
        failure_ = s;
        ++stats_.failures;
      }
      stats_.disk_bytes = disk;
      result = failure_;
      auto end = s.ok() ? waiters_.upper_bound(durable_) : waiters_.end();
      for (auto it = waiters_.begin(); it != end; ++it) ready.push_back(std::move(it->second));
      waiters_.erase(waiters_.begin(), end);
    }
    if (!s.ok()) {
      spdlog::error(
          "{}; the text cache is not persisted until a resync succeeds (every {} ms; answers say "
          "so)",
          std::string(s.message()), retry_interval_.count());
    }
    for (auto& done : ready) std::move(done)(result);
  }
}

}  // namespace rl::router
