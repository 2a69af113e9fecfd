#include "services/router/admin/lease_keeper.h"

#include "absl/time/time.h"

namespace rl::router::admin {

LeaseKeeper::LeaseKeeper(const Broadcaster* broadcaster) : broadcaster_(broadcaster) {
  if (!broadcaster_->options().lease_owner.empty()) thread_ = std::thread([this] { Loop(); });
}

LeaseKeeper::~LeaseKeeper() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void LeaseKeeper::RenewOnce() const {
  (void)broadcaster_->Gather(nullptr, rl::v1::GetServerInfoRequest(), &AsyncAdmin::GetServerInfo);
}

void LeaseKeeper::Loop() {
  const absl::Duration period = absl::FromChrono(broadcaster_->options().lease_ttl) / 3;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), period);
      if (stop_) return;
    }
    RenewOnce();
  }
}

}  // namespace rl::router::admin
