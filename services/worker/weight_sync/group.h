// Group rendezvous over TCP, shared by both backends: the sender listens and admits exactly
// one receiver per rank in [1, world_size); each receiver connects, says Hello and waits for
// the Welcome that the sender sends once the group is complete (wire.h).
//
// Invariants: a Hello with another group name, backend or world size, a rank out of range
// or a rank already taken is refused at once with an error Welcome naming the reason, and the
// refused peer does not count; a joined receiver that disconnects before the group completes
// frees its rank again; a peer that sends no Hello within 5 s is dropped. Every wait is
// bounded by GroupOptions::timeout.
// Cost: one accepted socket per receiver; the sender polls pending peers every 100 ms.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/worker/weight_sync/socket.h"
#include "services/worker/weight_sync/weight_sync.h"
#include "services/worker/weight_sync/wire.h"

namespace rl::weight_sync {

// "weight-sync group 'G' rank R at HOST:PORT" for messages.
std::string GroupContext(const GroupOptions& options);

// The stall bound of the data plane: stall_timeout, or timeout when that is zero.
std::chrono::milliseconds StallTimeout(const GroupOptions& options);

struct JoinedGroup {
  Socket control;
  Welcome welcome;
};

// Receiver side: connects to the sender, says Hello and waits for the OK Welcome.
absl::StatusOr<JoinedGroup> JoinGroup(const GroupOptions& options, BackendId backend);

// Sender side.
class GroupListener {
 public:
  static absl::StatusOr<GroupListener> Listen(const GroupOptions& options, BackendId backend);

  int port() const { return port_; }
  // Makes a pending or later AcceptAll fail promptly (any thread).
  void Shutdown() { listener_.Shutdown(); }

  // Admits receivers until every rank has joined, then sends each the OK Welcome carrying
  // `nccl_unique_id` (empty for tcp). Returns the control sockets indexed by rank - 1, and
  // stops listening.
  absl::StatusOr<std::vector<Socket>> AcceptAll(const std::string& nccl_unique_id);

 private:
  GroupListener(GroupOptions options, BackendId backend, Socket listener, int port)
      : options_(std::move(options)),
        backend_(backend),
        listener_(std::move(listener)),
        port_(port) {}

  // Reads and checks one Hello; refuses a bad one on the socket. Returns the admitted rank
  // (whose slot in `joined` may still hold a peer that has left, to be replaced).
  absl::StatusOr<int> Admit(const Socket& peer, const std::vector<Socket>& joined,
                            Clock::time_point deadline);

  GroupOptions options_;
  BackendId backend_;
  Socket listener_;
  int port_;
};

}  // namespace rl::weight_sync
