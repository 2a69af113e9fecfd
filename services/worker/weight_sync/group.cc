#include "services/worker/weight_sync/group.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace rl::weight_sync {
namespace {

constexpr auto kPendingPoll = std::chrono::milliseconds(100);
constexpr auto kHelloBudget = std::chrono::milliseconds(5000);

std::chrono::milliseconds Remaining(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

}  // namespace

std::string GroupContext(const GroupOptions& options) {
  return absl::StrCat("weight-sync group '", options.group_name, "' rank ", options.rank, " at ",
                      options.master_address, ":", options.master_port);
}

std::chrono::milliseconds StallTimeout(const GroupOptions& options) {
  return options.stall_timeout.count() > 0 ? options.stall_timeout : options.timeout;
}

absl::StatusOr<JoinedGroup> JoinGroup(const GroupOptions& options, BackendId backend) {
  const auto start = Clock::now();
  const auto deadline = start + options.timeout;
  const std::string context = GroupContext(options);
  auto control = ConnectTcp(options.master_address, options.master_port, deadline);
  if (!control.ok()) {
    return absl::Status(control.status().code(),
                        absl::StrCat(context, ": init failed: ", control.status().message()));
  }
  Hello hello{backend, options.rank, options.world_size, options.group_name};
  absl::Status sent = WriteMessage(*control, EncodeHello(hello), Remaining(deadline), "hello");
  if (!sent.ok()) {
    return absl::Status(sent.code(), absl::StrCat(context, ": init failed after ", ElapsedMs(start),
                                                  " ms: ", sent.message()));
  }
  auto body = ReadMessage(*control, Remaining(deadline), "welcome");
  if (!body.ok()) {
    if (absl::IsDeadlineExceeded(body.status())) {
      return absl::DeadlineExceededError(
          absl::StrCat(context, ": init timed out after ", ElapsedMs(start),
                       " ms: the sender accepted the connection but the group did not form (ranks "
                       "missing?)"));
    }
    return absl::Status(body.status().code(),
                        absl::StrCat(context, ": init failed after ", ElapsedMs(start),
                                     " ms: ", body.status().message()));
  }
  auto welcome = DecodeWelcome(*body);
  if (!welcome.ok()) {
    return absl::Status(welcome.status().code(),
                        absl::StrCat(context, ": init failed: ", welcome.status().message()));
  }
  if (welcome->code != absl::StatusCode::kOk) {
    return absl::Status(welcome->code,
                        absl::StrCat(context, ": the sender refused to join: ", welcome->message));
  }
  spdlog::info("{}: joined ({} backend) in {} ms", context, BackendName(backend), ElapsedMs(start));
  return JoinedGroup{*std::move(control), *std::move(welcome)};
}

absl::StatusOr<GroupListener> GroupListener::Listen(const GroupOptions& options,
                                                    BackendId backend) {
  ASSIGN_OR_RETURN(Socket listener, ListenTcp(options.master_address, options.master_port));
  ASSIGN_OR_RETURN(int port, LocalPort(listener));
  return GroupListener(options, backend, std::move(listener), port);
}

absl::StatusOr<int> GroupListener::Admit(const Socket& peer, const std::vector<Socket>& joined,
                                         Clock::time_point deadline) {
  auto budget = std::min(Remaining(deadline), kHelloBudget);
  ASSIGN_OR_RETURN(std::string body, ReadMessage(peer, budget, "hello"));
  auto hello = DecodeHello(body);
  absl::Status verdict = hello.status();
  if (verdict.ok()) {
    const int world = options_.world_size;
    if (hello->group_name != options_.group_name) {
      verdict = absl::InvalidArgumentError(absl::StrCat("group_name '", hello->group_name,
                                                        "' does not match the sender's '",
                                                        options_.group_name, "'"));
    } else if (hello->backend != backend_) {
      verdict = absl::InvalidArgumentError(absl::StrCat("backend ", BackendName(hello->backend),
                                                        " does not match the sender's ",
                                                        BackendName(backend_)));
    } else if (hello->world_size != world) {
      verdict = absl::InvalidArgumentError(
          absl::StrCat("world_size ", hello->world_size, " does not match the sender's ", world));
    } else if (hello->rank < 1 || hello->rank >= world) {
      verdict = absl::InvalidArgumentError(
          absl::StrCat("rank ", hello->rank, " is outside [1, ", world, ")"));
    } else if (joined[hello->rank - 1].valid() && !PeerClosedOrReadable(joined[hello->rank - 1])) {
      verdict = absl::AlreadyExistsError(
          absl::StrCat("rank ", hello->rank, " has already joined the group"));
    }
  }
  if (!verdict.ok()) {
    Welcome refusal{verdict.code(), std::string(verdict.message()), ""};
    absl::Status sent = WriteMessage(peer, EncodeWelcome(refusal), budget, "welcome");
    if (!sent.ok())
      spdlog::debug("weight-sync: refusal not delivered: {}", std::string(sent.message()));
    return verdict;
  }
  return hello->rank;
}

absl::StatusOr<std::vector<Socket>> GroupListener::AcceptAll(const std::string& nccl_unique_id) {
  const auto start = Clock::now();
  const auto deadline = start + options_.timeout;
  const std::string context = absl::StrCat("weight-sync group '", options_.group_name,
                                           "' sender on ", options_.master_address, ":", port_);
  std::vector<Socket> joined(options_.world_size - 1);
  int num_joined = 0;
  while (true) {
    // Sweep peers that gave up while waiting, also right before declaring the group complete.
    for (size_t i = 0; i < joined.size(); ++i) {
      if (joined[i].valid() && PeerClosedOrReadable(joined[i])) {
        spdlog::warn("{}: rank {} left before the group formed", context, i + 1);
        joined[i] = Socket();
        --num_joined;
      }
    }
    if (num_joined == options_.world_size - 1) break;
    if (Clock::now() >= deadline) {
      std::vector<int> missing;
      for (size_t i = 0; i < joined.size(); ++i) {
        if (!joined[i].valid()) missing.push_back(static_cast<int>(i) + 1);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          context, ": group did not form within ", ElapsedMs(start), " ms; ", num_joined, " of ",
          joined.size(), " receivers joined, missing ranks [", absl::StrJoin(missing, ", "), "]"));
    }
    auto peer = AcceptTcp(listener_, std::min(deadline, Clock::now() + kPendingPoll));
    if (!peer.ok()) {
      if (absl::IsDeadlineExceeded(peer.status())) continue;
      return absl::Status(peer.status().code(),
                          absl::StrCat(context, ": ", peer.status().message()));
    }
    auto rank = Admit(*peer, joined, deadline);
    if (!rank.ok()) {
      spdlog::warn("{}: refused a receiver: {}", context, std::string(rank.status().message()));
      continue;
    }
    if (joined[*rank - 1].valid()) {
      spdlog::warn("{}: rank {} left before the group formed; a new peer took its place", context,
                   *rank);
    } else {
      ++num_joined;
    }
    joined[*rank - 1] = *std::move(peer);
    spdlog::info("{}: rank {} joined ({} of {})", context, *rank, num_joined, joined.size());
  }
  Welcome ok{absl::StatusCode::kOk, "joined", nccl_unique_id};
  const std::string body = EncodeWelcome(ok);
  for (size_t i = 0; i < joined.size(); ++i) {
    absl::Status sent = WriteMessage(joined[i], body, Remaining(deadline), "welcome");
    if (!sent.ok()) {
      return absl::Status(sent.code(),
                          absl::StrCat(context, ": rank ", i + 1,
                                       " left while the group formed: ", sent.message()));
    }
  }
  listener_ = Socket();
  spdlog::info("{}: all {} receivers joined in {} ms", context, joined.size(), ElapsedMs(start));
  return joined;
}

}  // namespace rl::weight_sync
