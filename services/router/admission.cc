#include "services/router/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace rl::router {

absl::StatusOr<Admission::Result> Admission::Admit(const std::string& client, Waiter* waiter) {
  Waiter* evicted = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (queued_ == 0 && in_flight_ < limit_) {
      ++in_flight_;
      return Result::kAdmitted;
    }
    auto mine = queues_.find(client);
    const size_t my_queued = mine == queues_.end() ? 0 : mine->second.size();
    if (queued_ >= options_.max_queued) {
      // Full: take the newest place of the longest queue when this client has fewer waiting.
      auto longest = queues_.end();
      for (auto it = queues_.begin(); it != queues_.end(); ++it) {
        if (longest == queues_.end() || it->second.size() > longest->second.size()) longest = it;
      }
      if (options_.max_queued == 0 || longest == queues_.end() ||
          longest->second.size() <= my_queued + 1) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the router is at its limits: ", in_flight_, " generations in flight (--max-in-flight ",
            options_.max_in_flight > 0 ? absl::StrCat(options_.max_in_flight)
                                       : absl::StrCat("0: the workers' capacity, ", limit_),
            ") and ", queued_, " waiting (--max-queued ", options_.max_queued, "); retry later"));
      }
      evicted = longest->second.back();
      longest->second.pop_back();
      --queued_;
      if (longest->second.empty()) {
        turns_.erase(std::find(turns_.begin(), turns_.end(), longest->first));
        queues_.erase(longest);
      }
    }
    std::deque<Waiter*>& q = queues_[client];
    if (q.empty()) turns_.push_back(client);
    q.push_back(waiter);
    ++queued_;
  }
  if (evicted != nullptr) {
    evicted->Admitted(absl::ResourceExhaustedError(absl::StrCat(
        "the router's queue is full (--max-queued ", options_.max_queued,
        ") and this client held the most waiting requests: this one gave its place to another "
        "client's; retry later")));
  }
  return Result::kQueued;
}

bool Admission::Withdraw(const std::string& client, Waiter* waiter) {
  absl::MutexLock lock(&mu_);
  auto mine = queues_.find(client);
  if (mine == queues_.end()) return false;
  auto it = std::find(mine->second.begin(), mine->second.end(), waiter);
  if (it == mine->second.end()) return false;
  mine->second.erase(it);
  --queued_;
  if (mine->second.empty()) {
    turns_.erase(std::find(turns_.begin(), turns_.end(), client));
    queues_.erase(mine);
  }
  return true;
}

void Admission::Release() {
  Waiter* next = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (turns_.empty() || in_flight_ > limit_) {
      --in_flight_;
      return;
    }
    std::string client = std::move(turns_.front());
    turns_.pop_front();
    auto q = queues_.find(client);
    next = q->second.front();
    q->second.pop_front();
    --queued_;
    if (q->second.empty()) {
      queues_.erase(q);
    } else {
      turns_.push_back(std::move(client));
    }
  }
  next->Admitted(absl::OkStatus());  // the slot passes to it
}

void Admission::SetLimit(int limit) {
  if (options_.max_in_flight > 0) return;
  std::vector<Waiter*> admitted;
  {
    absl::MutexLock lock(&mu_);
    limit_ = std::max(limit, 1);
    while (in_flight_ < limit_ && !turns_.empty()) {
      std::string client = std::move(turns_.front());
      turns_.pop_front();
      auto q = queues_.find(client);
      admitted.push_back(q->second.front());
      q->second.pop_front();
      --queued_;
      ++in_flight_;
      if (q->second.empty()) {
        queues_.erase(q);
      } else {
        turns_.push_back(std::move(client));
      }
    }
  }
  for (Waiter* w : admitted) w->Admitted(absl::OkStatus());
}

int Admission::limit() const {
  absl::MutexLock lock(&mu_);
  return limit_;
}

int Admission::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

int Admission::queued() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

}  // namespace rl::router
