// WorkerDiscovery: the router's workers found by DNS (--worker-dns NAME:PORT, repeatable), as a
// Kubernetes headless Service publishes a StatefulSet's pods. A thread resolves every name each
// `interval` (sooner, after `retry`, when a lookup failed); every address becomes a worker
// "IP:PORT" in the pool, and an address that vanished from its name's answer is removed (drained:
// no new picks, the calls it runs finish; pool semantics). A failed lookup changes nothing: a DNS
// outage never empties the fleet; an answer with no address (NXDOMAIN, no records) does, as
// `kubectl scale --replicas=0` does. Only the workers it added are ever removed; a --worker or
// AddWorker address is the operator's.
//
// Cost: one lookup per name per round, one pool Add (a health probe) per new address. Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace rl::router::discovery {

// One --worker-dns value.
struct DnsTarget {
  std::string name;
  int port = 0;
};
// "NAME:PORT" → target; InvalidArgument naming --worker-dns otherwise.
absl::StatusOr<DnsTarget> ParseDnsTarget(const std::string& text);

struct DiscoveryOptions {
  std::chrono::milliseconds interval{5000};  // between rounds
  std::chrono::milliseconds retry{1000};     // after a failed lookup
};

class WorkerDiscovery {
 public:
  // A name's addresses (DnsResolver::Resolve in the router, a fake in tests).
  using Resolve = std::function<absl::StatusOr<std::vector<std::string>>(const std::string&)>;
  // The pool's registry (WorkerPool::Add / Remove in the router).
  struct Pool {
    std::function<absl::Status(const std::string&)> add;
    std::function<absl::Status(const std::string&)> remove;
  };

  // Resolves once (every target) before returning, then starts the round thread.
  WorkerDiscovery(std::vector<DnsTarget> targets, Resolve resolve, Pool pool,
                  DiscoveryOptions options);
  ~WorkerDiscovery();  // stops the thread after the round in progress
  WorkerDiscovery(const WorkerDiscovery&) = delete;
  WorkerDiscovery& operator=(const WorkerDiscovery&) = delete;

  // One round now (tests; the thread runs them). Returns false when a lookup failed.
  bool RunOnce() ABSL_LOCKS_EXCLUDED(round_mu_);
  // The addresses discovery added and still holds, sorted.
  std::vector<std::string> addresses() const ABSL_LOCKS_EXCLUDED(round_mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::vector<DnsTarget> targets_;
  const Resolve resolve_;
  const Pool pool_;
  const DiscoveryOptions options_;
  mutable absl::Mutex round_mu_;  // one round at a time
  // Per target: the worker addresses its last good answer gave.
  std::vector<std::set<std::string>> known_ ABSL_GUARDED_BY(round_mu_);
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rl::router::discovery
