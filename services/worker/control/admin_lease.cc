#include "services/worker/control/admin_lease.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace rl::worker {

absl::StatusOr<LeaseClaim> ParseLeaseClaim(const std::string* owner, const std::string* ttl_ms) {
  LeaseClaim claim;
  if (owner != nullptr) {
    if (owner->size() > 128) {
      return absl::InvalidArgumentError(
          absl::StrCat(kLeaseOwnerHeader, ": ", owner->size(), " bytes is over 128"));
    }
    for (char ch : *owner) {
      if (ch < 0x21 || ch > 0x7e) {
        return absl::InvalidArgumentError(
            absl::StrCat(kLeaseOwnerHeader, ": only printable ASCII without spaces"));
      }
    }
    claim.owner = *owner;
  }
  if (ttl_ms != nullptr) {
    int64_t ms = 0;
    if (!absl::SimpleAtoi(*ttl_ms, &ms) || ms < 100 || ms > 3600000) {
      return absl::InvalidArgumentError(absl::StrCat(kLeaseTtlHeader, ": '", ttl_ms->substr(0, 32),
                                                     "' is not an integer in [100, 3600000]"));
    }
    claim.ttl = std::chrono::milliseconds(ms);
  }
  return claim;
}

absl::Status AdminLease::Acquire(const LeaseClaim& claim, absl::string_view method) {
  if (claim.owner.empty()) return absl::OkStatus();  // the operator's call
  const auto now = clock_();
  absl::MutexLock lock(&mu_);
  const bool held = !owner_.empty() && now < expiry_;
  if (held && owner_ != claim.owner) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(expiry_ - now);
    return absl::FailedPreconditionError(absl::StrCat(
        method, ": the admin lease of this worker is held by '", owner_, "' for another ",
        left.count(), " ms; '", claim.owner, "' may take it once it lapses"));
  }
  owner_ = claim.owner;
  expiry_ = now + claim.ttl;
  return absl::OkStatus();
}

void AdminLease::Renew(const LeaseClaim& claim) {
  if (claim.owner.empty()) return;
  const auto now = clock_();
  absl::MutexLock lock(&mu_);
  if (owner_ == claim.owner && now < expiry_) expiry_ = std::max(expiry_, now + claim.ttl);
}

AdminLease::State AdminLease::state() const {
  const auto now = clock_();
  absl::MutexLock lock(&mu_);
  State s;
  if (owner_.empty() || now >= expiry_) return s;
  s.owner = owner_;
  s.expires_in_ms = std::chrono::duration_cast<std::chrono::milliseconds>(expiry_ - now).count();
  return s;
}

}  // namespace rl::worker
