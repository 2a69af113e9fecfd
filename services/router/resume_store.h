// ResumeStore: the partial samples the router keeps so a client can resume one by request id
// (GenerateRequest.resume_from.request_id; docs/weight-updates.md, "Resume"). A completion that
// ended ABORT or STALE with output is kept as the request that continues it: the resolved prompt
// ids, the original sampling params and the earlier output (ids, logprobs, version segments).
// LENGTH and STOP are not kept (a LENGTH sample has no budget left; a STOP one is complete).
//
// Bounded in entries (--resume-store-entries) and bytes (--resume-store-bytes, the serialized
// size): the least recently stored or read entry is evicted first; an entry bigger than the
// byte bound alone is not kept. Thread-safe (one mutex); Put/Get/Erase are O(entry bytes).
#pragma once

#include <cstdint>
#include <list>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "rl/v1/generate.pb.h"

namespace rl::router {

struct ResumeStoreOptions {
  int64_t max_entries = 4096;  // 0: off (nothing is kept, resume by id is refused)
  int64_t max_bytes = int64_t{256} << 20;
};

class ResumeStore {
 public:
  explicit ResumeStore(ResumeStoreOptions options) : options_(options) {}

  // Keeps (or replaces) `id`'s continuation: `resume` has input_ids (the prompt),
  // sampling_params (the original budget) and resume_from (output_ids, logprobs, segments).
  void Put(const std::string& id, rl::v1::GenerateRequest resume);
  // The continuation kept for `id` (marked recently used); NOT_FOUND naming why it may be
  // missing.
  absl::StatusOr<rl::v1::GenerateRequest> Get(const std::string& id);
  void Erase(const std::string& id);

  bool enabled() const { return options_.max_entries > 0; }
  size_t size() const;
  int64_t bytes() const;

 private:
  struct Entry {
    std::string id;
    rl::v1::GenerateRequest resume;
    int64_t bytes = 0;
  };
  void EraseLocked(std::list<Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ResumeStoreOptions options_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rl::router
