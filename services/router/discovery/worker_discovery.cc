#include "services/router/discovery/worker_discovery.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/server_runner.h"
#include "spdlog/spdlog.h"

namespace rl::router::discovery {

absl::StatusOr<DnsTarget> ParseDnsTarget(const std::string& text) {
  const size_t colon = text.rfind(':');
  DnsTarget t;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(text.substr(colon + 1), &t.port) || t.port <= 0 || t.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker-dns: '", text, "' is not NAME:PORT (port in [1, 65535])"));
  }
  t.name = text.substr(0, colon);
  if (t.name.size() > 253) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker-dns: the name of '", text.substr(0, 64), "...' is over 253 bytes"));
  }
  return t;
}

WorkerDiscovery::WorkerDiscovery(std::vector<DnsTarget> targets, Resolve resolve, Pool pool,
                                 DiscoveryOptions options)
    : targets_(std::move(targets)),
      resolve_(std::move(resolve)),
      pool_(std::move(pool)),
      options_(options) {
  {
    absl::MutexLock lock(&round_mu_);
    known_.resize(targets_.size());
  }
  (void)RunOnce();
  thread_ = std::thread([this] { Loop(); });
}

WorkerDiscovery::~WorkerDiscovery() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

bool WorkerDiscovery::RunOnce() {
  absl::MutexLock lock(&round_mu_);
  bool all_ok = true;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const DnsTarget& t = targets_[i];
    absl::StatusOr<std::vector<std::string>> ips = resolve_(t.name);
    if (!ips.ok()) {
      all_ok = false;
      spdlog::warn("--worker-dns {}: {}; keeping its {} worker(s)", t.name,
                   std::string(ips.status().message()), known_[i].size());
      continue;
    }
    std::set<std::string> now;
    for (const std::string& ip : *ips) now.insert(JoinHostPort(ip, t.port));
    // Held by another target too: not removed while any target still names it.
    const auto held_elsewhere = [&](const std::string& address) {
      for (size_t j = 0; j < known_.size(); ++j) {
        if (j != i && known_[j].count(address) > 0) return true;
      }
      return false;
    };
    for (const std::string& gone : known_[i]) {
      if (now.count(gone) > 0 || held_elsewhere(gone)) continue;
      spdlog::info("--worker-dns {}: {} is gone; removing it (its calls finish)", t.name, gone);
      (void)pool_.remove(gone);
    }
    for (const std::string& address : now) {
      if (known_[i].count(address) > 0) continue;
      spdlog::info("--worker-dns {}: adding {}", t.name, address);
      if (absl::Status s = pool_.add(address); !s.ok()) {
        spdlog::warn("--worker-dns {}: adding {}: {}", t.name, address, std::string(s.message()));
      }
    }
    known_[i] = std::move(now);
  }
  return all_ok;
}

std::vector<std::string> WorkerDiscovery::addresses() const {
  absl::MutexLock lock(&round_mu_);
  std::set<std::string> all;
  for (const auto& k : known_) all.insert(k.begin(), k.end());
  return {all.begin(), all.end()};
}

void WorkerDiscovery::Loop() {
  bool ok = true;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      const auto wait = ok ? options_.interval : options_.retry;
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(wait));
      if (stop_) return;
    }
    ok = RunOnce();
  }
}

}  // namespace rl::router::discovery
