#include "services/worker/engine/kv_events.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace rl::engine {

std::shared_ptr<KvEventLog> KvEventLog::Create(size_t max_units, size_t max_subscribers) {
  return std::shared_ptr<KvEventLog>(new KvEventLog(max_units, max_subscribers));
}

bool KvEventLog::active() const {
  absl::MutexLock lock(&mu_);
  return !subscribers_.empty();
}

size_t KvEventLog::buffered_units() const {
  absl::MutexLock lock(&mu_);
  return units_;
}

size_t KvEventLog::num_subscribers() const {
  absl::MutexLock lock(&mu_);
  return subscribers_.size();
}

void KvEventLog::Append(std::vector<KvCacheEvent> events, double unix_s) {
  if (events.empty()) return;
  auto batch = std::make_shared<KvEventBatch>();
  batch->unix_s = unix_s;
  for (const KvCacheEvent& e : events) batch->units += e.units();
  batch->events = std::move(events);
  absl::MutexLock lock(&mu_);
  batch->seq = next_seq_++;
  units_ += batch->units;
  batches_.push_back(std::move(batch));
  // Oldest first past the bound; the newest stays whatever its size.
  while (units_ > max_units_ && batches_.size() > 1) {
    units_ -= batches_.front()->units;
    batches_.pop_front();
  }
  DropReadLocked();
  for (Subscription* s : subscribers_) {
    if (s->waiting_) {
      s->waiting_ = false;
      s->notify_();
    }
  }
}

absl::StatusOr<std::unique_ptr<KvEventLog::Subscription>> KvEventLog::Subscribe(
    std::vector<KvCacheEvent> snapshot, std::function<void()> notify) {
  std::unique_ptr<Subscription> s(new Subscription(shared_from_this(), std::move(notify)));
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("KV events: the worker is shutting down");
  if (subscribers_.size() >= max_subscribers_) {
    return absl::ResourceExhaustedError(absl::StrCat("KV event subscribers: ", subscribers_.size(),
                                                     " already (at most ", max_subscribers_, ")"));
  }
  s->snapshot_ = std::move(snapshot);
  s->snapshot_unix_s_ = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  s->next_seq_ = next_seq_;
  subscribers_.push_back(s.get());
  return s;
}

void KvEventLog::DropReadLocked() {
  uint64_t oldest_needed = next_seq_;
  for (const Subscription* s : subscribers_) oldest_needed = std::min(oldest_needed, s->next_seq_);
  while (!batches_.empty() && batches_.front()->seq < oldest_needed) {
    units_ -= batches_.front()->units;
    batches_.pop_front();
  }
}

void KvEventLog::Close() {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  closed_ = true;
  for (Subscription* s : subscribers_) {
    if (s->waiting_) {
      s->waiting_ = false;
      s->notify_();
    }
  }
}

void KvEventLog::Remove(Subscription* s) {
  absl::MutexLock lock(&mu_);
  subscribers_.erase(std::remove(subscribers_.begin(), subscribers_.end(), s), subscribers_.end());
  DropReadLocked();
}

KvEventLog::Subscription::~Subscription() { log_->Remove(this); }

absl::Status KvEventLog::Subscription::Take(size_t max_batches, size_t max_units,
                                            std::vector<std::shared_ptr<const KvEventBatch>>* out) {
  KvEventLog& log = *log_;
  absl::MutexLock lock(&log.mu_);
  if (log.closed_) return absl::UnavailableError("KV events: the worker is shutting down");
  size_t taken = 0;
  // The snapshot, in parts of at most max_units (a part holds at least one event).
  while (taken < max_batches && snapshot_next_ < snapshot_.size()) {
    auto part = std::make_shared<KvEventBatch>();
    part->unix_s = snapshot_unix_s_;
    while (snapshot_next_ < snapshot_.size() &&
           (part->events.empty() || part->units + snapshot_[snapshot_next_].units() <= max_units)) {
      part->units += snapshot_[snapshot_next_].units();
      part->events.push_back(std::move(snapshot_[snapshot_next_++]));
    }
    out->push_back(std::move(part));
    ++taken;
  }
  if (snapshot_next_ == snapshot_.size() && !snapshot_.empty()) {
    snapshot_.clear();
    snapshot_.shrink_to_fit();
    snapshot_next_ = 0;
  }
  if (!log.batches_.empty() && log.batches_.front()->seq > next_seq_) {
    return absl::DataLossError(absl::StrCat(
        "KV event subscriber fell behind: the worker dropped ",
        log.batches_.front()->seq - next_seq_, " batches it had not read (its buffer holds ",
        log.max_units_, " tokens and hashes); subscribe again from 0 for a snapshot"));
  }
  for (const auto& b : log.batches_) {
    if (taken >= max_batches) break;
    if (b->seq < next_seq_) continue;
    out->push_back(b);
    next_seq_ = b->seq + 1;
    ++taken;
  }
  waiting_ = taken == 0;
  if (taken > 0) log.DropReadLocked();
  return absl::OkStatus();
}

}  // namespace rl::engine
