// WorkerPool: the router's view of the rl-worker fleet.
//
// Each worker has a channel and stubs, a state (live | dead), an enabled flag (routing only;
// admin broadcasts still reach disabled live workers), an exact in-flight count and the weight
// version it last reported. A health thread checks every worker each interval (gRPC health
// + GetLoad for the version): `failure_threshold` consecutive failures mark it dead,
// `success_threshold` consecutive successes bring it back, and only if it reports the current
// weight version (the newest among live workers; any version when none is live) so a
// restarted worker with stale weights never serves. Data-plane UNAVAILABLE errors count as
// failures too.
//
// Pick() is round-robin over live, enabled workers whose health is SERVING, skipping excluded ones;
// the returned Lease holds one in-flight unit until destroyed. Thread-safe; Pick is O(#workers).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/channel.h"
#include "rl/v1/admin.grpc.pb.h"
#include "rl/v1/router.pb.h"
#include "rl/v1/worker.grpc.pb.h"

namespace rl::router {

struct PoolOptions {
  std::chrono::milliseconds health_interval{1000};
  std::chrono::milliseconds health_timeout{2000};
  int failure_threshold = 2;
  int success_threshold = 1;
};

class Worker {
 public:
  explicit Worker(std::string address);
  const std::string& address() const { return address_; }
  rl::v1::Worker::Stub& worker_stub() { return *worker_stub_; }
  rl::v1::Admin::Stub& admin_stub() { return *admin_stub_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  int32_t in_flight() const { return in_flight_.load(); }

 private:
  friend class WorkerPool;
  friend class Lease;
  const std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<rl::v1::Worker::Stub> worker_stub_;
  std::unique_ptr<rl::v1::Admin::Stub> admin_stub_;
  std::atomic<int32_t> in_flight_{0};
  std::atomic<int64_t> served_{0};
  // Guarded by the pool's mutex.
  bool live_ = false;
  bool enabled_ = true;
  bool serving_ = true;  // gRPC health SERVING (NOT_SERVING: asleep or updating weights)
  bool removed_ = false;
  int failures_ = 0;
  int successes_ = 0;
  int64_t weight_version_ = -1;
};

// One in-flight unit on a worker; movable, releases on destruction.
class Lease {
 public:
  Lease() = default;
  explicit Lease(std::shared_ptr<Worker> w);
  Lease(Lease&& other) noexcept = default;
  Lease& operator=(Lease&& other) noexcept;
  ~Lease();
  Worker* operator->() const { return worker_.get(); }
  Worker* get() const { return worker_.get(); }
  explicit operator bool() const { return worker_ != nullptr; }

 private:
  std::shared_ptr<Worker> worker_;
};

class WorkerPool {
 public:
  explicit WorkerPool(const PoolOptions& options);
  ~WorkerPool();  // stops the health thread

  // Adds (idempotent) and checks the worker once before returning; InvalidArgument for an
  // address that is not HOST:PORT.
  absl::Status Add(const std::string& address);
  absl::Status Remove(const std::string& address);  // NotFound when unknown
  absl::Status SetEnabled(const std::string& address, bool enabled);
  // Current state of every worker, sorted by address.
  std::vector<rl::v1::WorkerStatus> List() const;

  // Marks a worker's health as (not) serving right away (sleep / wake broadcasts); the next
  // health check refreshes it.
  void SetServing(const std::string& address, bool serving);
  // A live, enabled, serving worker not in `exclude`, round-robin; an empty lease when none.
  Lease Pick(const std::set<std::string>& exclude = {});

  // Holds: an admin broadcast that takes workers out of routing for its duration holds the pool
  // (BeginHold / EndHold, nested). While held, a request that finds no routable worker waits for
  // the broadcast to end instead of failing (router_service.h).
  void BeginHold() { holds_.fetch_add(1); }
  void EndHold() { holds_.fetch_sub(1); }
  bool held() const { return holds_.load() > 0; }
  // Live workers (enabled or not): the targets of admin broadcasts.
  std::vector<std::shared_ptr<Worker>> LiveWorkers() const;
  std::shared_ptr<Worker> Find(const std::string& address) const;
  bool IsEnabled(const std::string& address) const;

  // A data-plane call to `w` failed with UNAVAILABLE.
  void ReportFailure(Worker* w);
  // `w` reported weight `version` (responses, admin results).
  void ReportVersion(Worker* w, int64_t version);
  // Runs one health round now (tests; the thread does this every interval).
  void CheckAll();
  // The newest weight version among live workers (-1 when none is live).
  int64_t CurrentVersion() const;
  bool VersionMismatch() const;

 private:
  void CheckOne(const std::shared_ptr<Worker>& w);
  void HealthLoop();
  int64_t CurrentVersionLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PoolOptions options_;
  mutable absl::Mutex mu_;
  std::atomic<int> holds_{0};
  std::vector<std::shared_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread health_thread_;
};

}  // namespace rl::router
