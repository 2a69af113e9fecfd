// RequestTable: the router's in-flight Generate requests by request id, with the worker that
// holds each one now, so Router.Abort can be forwarded to that worker, and an "aborted" mark
// that stops the request from being retried elsewhere.
//
// An id is registered for the lifetime of one Router.Generate (RequestTable::Handle, RAII). A
// second concurrent request with an id already in flight is not registered (Add returns an
// empty handle): aborting that id reaches the first one only. A request may name a GRPO group
// (GenerateRequest.group_id): MarkGroupAborted marks every member in flight (issue 34's
// over-sampling aborts the groups it no longer needs). Thread-safe; every call is O(1) except
// MarkAllAborted and MarkGroupAborted (O(#in flight)).
#pragma once

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace rl::router {

class RequestTable {
 public:
  // Removes its id from the table on destruction (when it registered one).
  class Handle {
   public:
    Handle() = default;
    Handle(RequestTable* table, std::string id) : table_(table), id_(std::move(id)) {}
    Handle(Handle&& other) noexcept { *this = std::move(other); }
    Handle& operator=(Handle&& other) noexcept;
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle();
    // The worker now running the request ("" between attempts).
    void SetWorker(const std::string& address) const;
    // True once Router.Abort named this request (or abort_all ran).
    bool aborted() const;

   private:
    void Release();
    RequestTable* table_ = nullptr;
    std::string id_;
  };

  // A fresh id for a request that came without one (NewServerRequestId with "rtr-").
  static std::string NewId();
  // Registers `id` (a member of `group_id` when not empty); an empty handle when it is already
  // in flight.
  Handle Add(const std::string& id, const std::string& group_id = "");
  // Marks `id` aborted and returns the worker holding it ("" between attempts); NotFound
  // when no such request is in flight.
  absl::StatusOr<std::string> MarkAborted(const std::string& id);
  // Marks every in-flight request aborted; returns how many.
  int MarkAllAborted();
  // Marks every in-flight request of `group_id` aborted; returns their ids.
  std::vector<std::string> MarkGroupAborted(const std::string& group_id);
  size_t size() const;

 private:
  struct Entry {
    std::string worker;
    std::string group_id;
    bool aborted = false;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rl::router
