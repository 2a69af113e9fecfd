#include "services/router/pool/call_registry.h"

namespace rl::router {

void CallRegistry::CancelAll(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  cancelling_ = true;
  reason_ = reason;
  for (CallGuard* g : calls_) {
    g->registry_->mu_.AssertHeld();  // g->registry_ == this
    g->reason_ = reason;
    g->cancelled_ = true;
    g->ctx_->TryCancel();
  }
}

void CallRegistry::Reopen() {
  absl::MutexLock lock(&mu_);
  cancelling_ = false;
  reason_.clear();
}

size_t CallRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return calls_.size();
}

CallGuard::CallGuard(CallRegistry* registry, grpc::ClientContext* ctx)
    : registry_(registry), ctx_(ctx) {
  absl::MutexLock lock(&registry_->mu_);
  if (registry_->cancelling_) {
    reason_ = registry_->reason_;
    cancelled_ = true;
    ctx_->TryCancel();
  }
  registry_->calls_.insert(this);
}

CallGuard::~CallGuard() {
  absl::MutexLock lock(&registry_->mu_);
  registry_->calls_.erase(this);
}

std::string CallGuard::reason() const {
  absl::MutexLock lock(&registry_->mu_);
  return reason_;
}

}  // namespace rl::router
