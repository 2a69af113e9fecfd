#include "services/router/resume_store.h"

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"

namespace rl::router {

void ResumeStore::Put(const std::string& id, rl::v1::GenerateRequest resume) {
  if (!enabled()) return;
  const int64_t bytes = static_cast<int64_t>(resume.ByteSizeLong() + id.size());
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(id); it != index_.end()) EraseLocked(it->second);
  if (bytes > options_.max_bytes) return;
  lru_.push_front(Entry{id, std::move(resume), bytes});
  index_[id] = lru_.begin();
  bytes_ += bytes;
  while (static_cast<int64_t>(lru_.size()) > options_.max_entries || bytes_ > options_.max_bytes) {
    EraseLocked(std::prev(lru_.end()));
  }
}

absl::StatusOr<rl::v1::GenerateRequest> ResumeStore::Get(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(id);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "resume_from.request_id: the router holds no partial sample of '", id,
        "' (only requests that ended ABORT or STALE with output are kept, a LENGTH one has no "
        "budget left; it may have been evicted (--resume-store-entries/--resume-store-bytes), "
        "resumed already, or kept by another router): resume by output_ids with the prompt"));
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->resume;
}

void ResumeStore::Erase(const std::string& id) {
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(id); it != index_.end()) EraseLocked(it->second);
}

void ResumeStore::EraseLocked(std::list<Entry>::iterator it) {
  bytes_ -= it->bytes;
  index_.erase(it->id);
  lru_.erase(it);
}

size_t ResumeStore::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

int64_t ResumeStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace rl::router
