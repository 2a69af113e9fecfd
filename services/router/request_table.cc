#include "services/router/request_table.h"

#include <atomic>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/request_limits.h"

namespace rl::router {

RequestTable::Handle& RequestTable::Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    Release();
    table_ = other.table_;
    id_ = std::move(other.id_);
    other.table_ = nullptr;
  }
  return *this;
}

RequestTable::Handle::~Handle() { Release(); }

void RequestTable::Handle::Release() {
  if (table_ == nullptr) return;
  absl::MutexLock lock(&table_->mu_);
  table_->entries_.erase(id_);
  table_ = nullptr;
}

void RequestTable::Handle::SetWorker(const std::string& address) const {
  if (table_ == nullptr) return;
  absl::MutexLock lock(&table_->mu_);
  auto it = table_->entries_.find(id_);
  if (it != table_->entries_.end()) it->second.worker = address;
}

bool RequestTable::Handle::aborted() const {
  if (table_ == nullptr) return false;
  absl::MutexLock lock(&table_->mu_);
  auto it = table_->entries_.find(id_);
  return it != table_->entries_.end() && it->second.aborted;
}

std::string RequestTable::NewId() { return NewServerRequestId(kRouterRequestIdPrefix); }

RequestTable::Handle RequestTable::Add(const std::string& id, const std::string& group_id) {
  absl::MutexLock lock(&mu_);
  auto [it, added] = entries_.try_emplace(id);
  if (!added) return Handle();
  it->second.group_id = group_id;
  return Handle(this, id);
}

absl::StatusOr<std::string> RequestTable::MarkAborted(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("request_id: '", id, "' is not in flight"));
  }
  it->second.aborted = true;
  return it->second.worker;
}

int RequestTable::MarkAllAborted() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, entry] : entries_) entry.aborted = true;
  return static_cast<int>(entries_.size());
}

std::vector<std::string> RequestTable::MarkGroupAborted(const std::string& group_id) {
  std::vector<std::string> ids;
  if (group_id.empty()) return ids;
  absl::MutexLock lock(&mu_);
  for (auto& [id, entry] : entries_) {
    if (entry.group_id != group_id) continue;
    entry.aborted = true;
    ids.push_back(id);
  }
  return ids;
}

size_t RequestTable::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace rl::router
