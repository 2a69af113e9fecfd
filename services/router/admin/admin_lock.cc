#include "services/router/admin/admin_lock.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace rl::router::admin {

absl::Status AdminLock::Acquire(const char* what) {
  absl::MutexLock lock(&mu_);
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&free), absl::FromChrono(timeout_))) {
    return absl::UnavailableError(
        absl::StrCat(what, ": another admin operation holds the admin lock (waited ",
                     timeout_.count(), " ms); try again later"));
  }
  busy_ = true;
  return absl::OkStatus();
}

void AdminLock::Release() {
  absl::MutexLock lock(&mu_);
  busy_ = false;
}

}  // namespace rl::router::admin
