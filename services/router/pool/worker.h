// Worker: the router's handle on one rl-worker process: its address, its gRPC channels and
// stubs, the exact number of the router's requests it runs (held by Lease), and the registry of
// the calls open to it (call_registry.h). Its routing state (health, enablement, holds, version)
// is the pool's, under the pool's lock (worker_state.h); a handle outlives its removal from the
// pool for as long as a lease or a call holds it.
//
// Cost: kDataChannels HTTP/2 connections per worker (the first shared with the control stubs),
// opened lazily by gRPC.
// Thread-safe: immutable after construction but for the atomic counters and the registry.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/channel.h"
#include "rl/v1/admin.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"
#include "services/router/pool/call_registry.h"

namespace rl::router {

// Data-plane channels per worker (Worker::data_stub).
inline constexpr int kDataChannels = 4;

class Worker {
 public:
  explicit Worker(std::string address);
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  const std::string& address() const { return address_; }
  rl::v1::Worker::Stub& worker_stub() { return *worker_stub_; }
  // For Generate calls: one of kDataChannels channels in turn (the first is worker_stub's).
  // Each channel has its own HTTP/2 connection (processed by one thread at a time) and its own
  // callback completion queue, whose bookkeeping in Debian's gRPC (built without NDEBUG: a
  // linear scan of the queue's pending operations per completion) then covers a fraction of
  // the streams.
  rl::v1::Worker::Stub& data_stub() {
    return *data_stubs_[next_data_.fetch_add(1, std::memory_order_relaxed) % data_stubs_.size()];
  }
  rl::v1::Admin::Stub& admin_stub() { return *admin_stub_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  // Calls open to this worker (cancelled when the pool marks it dead).
  CallRegistry& calls() { return calls_; }
  // The router's requests running on it now (leases).
  int32_t in_flight() const { return in_flight_.load(); }
  // The samples of those requests (a request with n samples counts n): what policies balance.
  int32_t load() const { return load_.load(); }
  // Its KV-cache usage in [0, 1] as its last health check's GetLoad reported it.
  double kv_usage() const { return kv_usage_.load(std::memory_order_relaxed); }
  void set_kv_usage(double usage) { kv_usage_.store(usage, std::memory_order_relaxed); }
  // Prompt tokens of the completions it finished for this router, and those it served from its
  // prefix cache (GenerateFinal.cached_tokens): its prefix-cache hit rate as it reports it.
  void RecordPrefix(int64_t prompt_tokens, int64_t cached_tokens) {
    prompt_tokens_.fetch_add(prompt_tokens, std::memory_order_relaxed);
    cached_tokens_.fetch_add(cached_tokens, std::memory_order_relaxed);
  }
  int64_t prompt_tokens() const { return prompt_tokens_.load(std::memory_order_relaxed); }
  int64_t cached_tokens() const { return cached_tokens_.load(std::memory_order_relaxed); }
  // Times the pool picked it.
  int64_t served() const { return served_.load(); }
  void CountServed() { served_.fetch_add(1); }

 private:
  friend class Lease;

  const std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<rl::v1::Worker::Stub> worker_stub_;
  std::vector<std::unique_ptr<rl::v1::Worker::Stub>> data_stubs_;  // [0] shares channel_
  std::atomic<uint32_t> next_data_{0};
  std::unique_ptr<rl::v1::Admin::Stub> admin_stub_;
  CallRegistry calls_;
  std::atomic<int32_t> in_flight_{0};
  std::atomic<int32_t> load_{0};
  std::atomic<double> kv_usage_{0};
  std::atomic<int64_t> served_{0};
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> cached_tokens_{0};
};

// One in-flight request on a worker (Worker::in_flight) and its `units` samples (Worker::load);
// movable, released on destruction. An empty lease holds no worker.
class Lease {
 public:
  Lease() = default;
  explicit Lease(std::shared_ptr<Worker> w, int32_t units = 1);
  Lease(Lease&& other) noexcept;
  Lease& operator=(Lease&& other) noexcept;
  ~Lease();
  Worker* operator->() const { return worker_.get(); }
  Worker* get() const { return worker_.get(); }
  explicit operator bool() const { return worker_ != nullptr; }

 private:
  void Drop();

  std::shared_ptr<Worker> worker_;
  int32_t units_ = 0;
};

}  // namespace rl::router
