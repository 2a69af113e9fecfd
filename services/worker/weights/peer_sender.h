// PeerSender: SendWeightsToPeer, the sending side of peer catch-up (issue 30). A worker serving
// the fleet's version streams every weight it serves to another rl-worker as one
// UpdateWeightsFromTensor call (its first message the options: the version and the policy;
// bounded chunks; the explicit TensorStreamEnd with the counts and the rank digest of what was
// sent), so the receiver validates everything, verifies the digest and only then applies it in
// one step: a send that is cut (this worker dies, the call is cancelled, the deadline passes, a
// weight update lands here meanwhile) applies nothing. docs/weight-updates.md, "Sending to a
// peer", has the rules.
//
// Design: the served weights are read in slices between engine steps, not in one pause: each
// engine-thread hop checks that the served version and the lifecycle's apply count are those of
// the first hop (else the send is cut: the slices would mix two versions), then copies the next
// `slice_bytes` of tensors (name order) into one host buffer; the stream is then written and
// hashed from that buffer off the engine thread while the engine keeps generating. Both backends
// read their host copy of the weights (the CUDA runner keeps one), so the send never touches the
// device.
// Cost: one host buffer of `slice_bytes` (32 MiB by default) and the gRPC send buffers; each
// hop stalls one engine step by one memcpy of the slice (~3-10 ms for 32 MiB on a server CPU);
// SHA-256 of every byte once, on the sending thread. One send at a time per worker.
// Thread-safe: Send from any thread (not the engine's); Shutdown from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/request_limits.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "services/worker/engine/engine.h"
#include "services/worker/weights/weight_updates.h"

namespace rl::worker {

// The receiving side's check of a full-state stream (TensorStreamEnd.rank_sha256): every served
// weight arrived and the rank digest of what arrived (names, the dtypes sent, shapes, bytes)
// equals `expected_rank_sha256`. Returns the per-tensor digests it computed (TensorDigest, by
// name: the caller keeps them instead of hashing again); INVALID_ARGUMENT naming what differs,
// and the caller then applies nothing.
absl::StatusOr<std::map<std::string, std::string>> VerifyFullState(
    const std::vector<NamedTensor>& tensors, const WeightShapes& served,
    const std::string& expected_rank_sha256);

class PeerSender {
 public:
  struct Deps {
    engine::Engine* engine = nullptr;  // outlives the sender
    RequestLimits limits;              // max_tensor_chunk_bytes bounds a chunk
    // Weight applies started so far (WeightUpdateController::applies): a change mid-send cuts it.
    std::function<uint64_t()> applies;
    // Bytes copied per engine-thread hop.
    int64_t slice_bytes = int64_t{32} << 20;
    // The channel to `target`; empty: an insecure channel (the fleet's transport).
    std::function<std::shared_ptr<grpc::Channel>(const std::string& target)> channel;
  };
  struct Request {
    std::string target;  // HOST:PORT of the receiving rl-worker
    int64_t weight_version = -1;
    int64_t chunk_bytes = 0;  // 0: 1 MiB
    bool abort_all_requests = false;
    bool keep_pause = false;
    std::chrono::milliseconds timeout{0};  // 0: 10 min
    // Headers forwarded to the receiver (authorization, the admin lease claim).
    std::vector<std::pair<std::string, std::string>> metadata;
  };
  struct Outcome {
    AdminOutcome admin;       // message, the version sent, the duration
    std::string rank_sha256;  // of what was sent; the receiver verified the same
    int64_t num_tensors = 0;
    int64_t num_bytes = 0;
  };

  explicit PeerSender(Deps deps);
  ~PeerSender() { Shutdown(); }
  PeerSender(const PeerSender&) = delete;
  PeerSender& operator=(const PeerSender&) = delete;

  // Sends (see the file comment) and returns once the receiver answered. `cancelled`, polled
  // between messages, ends the send early (the caller's call was cancelled). Errors:
  // INVALID_ARGUMENT for a bad request; FAILED_PRECONDITION when this worker does not serve
  // `weight_version`, is asleep, or a send is in flight; ABORTED when the weights changed during
  // the send; the receiver's own status (prefixed with its address) when it refused or failed;
  // CANCELLED after Shutdown or `cancelled`. Nothing is applied on the receiver unless OK.
  absl::StatusOr<Outcome> Send(const Request& request, const std::function<bool()>& cancelled)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Cuts the send in flight (its stream is cancelled: the receiver applies nothing) and refuses
  // later ones. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status CheckRequest(const Request& r) const;
  absl::StatusOr<Outcome> SendLocked(const Request& r, const std::function<bool()>& cancelled,
                                     grpc::ClientContext* ctx);

  const Deps deps_;
  absl::Mutex mu_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* in_flight_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace rl::worker
