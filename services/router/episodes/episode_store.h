// EpisodeStore: the router's record of agent episodes. Every completion of a generation that
// names an episode (GenerateRequest.episode_id, or `episode=ID` in the request id on the SGLang
// path) is recorded as one turn: its whole trajectory as the router built it (prompt tokens with
// earlier turns' generated tokens reused exactly through the text cache, then the output), loss
// mask, rollout logprobs and per-token weight versions. Turns form a tree: a turn's parent is
// the latest earlier turn whose whole trajectory is a token prefix of the turn's prompt (or all
// of it but a final stop token, which a chat template may drop); a turn whose prompt extends no
// earlier turn is a root. An edited history or a sub-agent thus forks, and branches never mix.
// Export gives one sample per leaf: the leaf's trajectory, which holds its whole branch.
// R3: a turn sent with return_routed_experts keeps the routing its worker returned; an export
// that asks for routing assembles each branch's from its turns, root first: every token's
// routing is the one computed when the token was first processed (an earlier turn's, for the
// tokens a later turn re-sends), so a later turn contributes from where its parent's ends.
// docs/episodes.md has the rules in full.
//
// Bounded: at most max_episodes episodes (the least recently used, by Record or
// Export, is dropped), max_turns and
// max_episode_tokens per episode (a turn past them is refused; a turn's routing counts too, at
// its bytes / kEpisodeBytesPerToken: the bound is a memory bound of 17 B x max_episode_tokens),
// and GC by age (an episode idle for ttl) and by version (an episode whose newest turn is
// gc_threshold_k versions behind the fleet, as the text cache collects; checked when the fleet's
// version moves).
//
// Cost: Record O(turns * prompt) for the parent search; Export O(turns^2 + tokens), plus the
// routing bytes copied when asked. Memory: 17 B per recorded token, plus the routing as the
// worker sent it (4 B per token, MoE layer and top-k slot; twice that with weights). Thread-safe
// (one mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "rl/v1/generate.pb.h"
#include "rl/v1/router.pb.h"

namespace rl::router {

// What one recorded token costs (id, mask, logprob, version): the unit of max_episode_tokens.
inline constexpr int64_t kEpisodeBytesPerToken = 17;

// Longest episode id.
inline constexpr size_t kMaxEpisodeIdLen = 128;

// InvalidArgument unless `id` is 1 to kMaxEpisodeIdLen letters, digits, '_' or '.'.
absl::Status ValidateEpisodeId(absl::string_view id);

struct EpisodeOptions {
  int64_t max_episodes = 10000;
  int64_t max_turns = 1024;
  int64_t max_episode_tokens = 1 << 22;
  std::chrono::seconds ttl{3600};
  int64_t gc_threshold_k = 2;

  absl::Status Validate() const;
};

struct EpisodeTurnRecord {
  std::string request_id;
  int32_t index = 0;
  std::string worker;
  std::vector<int32_t> tokens;  // prompt then output
  std::vector<uint8_t> mask;
  std::vector<float> logprobs;
  std::vector<int64_t> versions;
  int32_t prompt_tokens = 0;
  int64_t weight_version = 0;
  rl::v1::FinishReason finish_reason = rl::v1::FINISH_REASON_UNSPECIFIED;
  int32_t matched_token_id = -1;
  // R3: the routing the worker returned for the turn (GenerateFinal.routed_experts), positions
  // in `tokens`; unset when the turn was sent without return_routed_experts. Record checks it
  // and drops one that does not fit (the turn is kept, without routing; routing_note says why).
  std::optional<rl::v1::RoutedExperts> routing;
  std::string routing_note;
};

// What an export returns besides the turns and trajectories.
struct EpisodeExportOptions {
  bool remove = false;          // forget the episode once exported
  bool routed_experts = false;  // each sample's routing (R3)
  bool expert_weights = false;  // and its routing weights (needs routed_experts)
};

// Live figures (episodes, turns, tokens held) and totals since the start.
struct EpisodeStats {
  int64_t episodes = 0;
  int64_t turns = 0;
  int64_t tokens = 0;
  int64_t bytes = 0;             // trajectories (17 B per token) and routing
  int64_t recorded_turns = 0;    // total turns recorded
  int64_t refused_turns = 0;     // over max_turns / max_episode_tokens
  int64_t exports = 0;           // Export calls answered
  int64_t exported_samples = 0;  // samples in those answers
  int64_t removed = 0;           // episodes forgotten by an export with remove
  int64_t collected = 0;         // episodes dropped by age, version or the episode bound
};

class EpisodeStore {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  explicit EpisodeStore(const EpisodeOptions& options, Clock clock = nullptr);

  // Records one turn (the vectors must have equal lengths, prompt_tokens <= that).
  // InvalidArgument for a bad id or inconsistent record; ResourceExhausted past the episode's
  // bounds (the turn is not recorded, the episode is kept).
  absl::Status Record(absl::string_view episode_id, EpisodeTurnRecord turn)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The episode's turns and samples; NOT_FOUND when not held. `remove` forgets it.
  absl::StatusOr<rl::v1::GetEpisodeResponse> Export(absl::string_view episode_id, bool remove)
      ABSL_LOCKS_EXCLUDED(mu_);
  // With routing (R3): each sample's routed experts, assembled from the turns of its branch.
  // FailedPrecondition naming the turn when a turn of a branch has no routing (or no weights
  // when asked, or another [layers, top_k], or routing that leaves a gap); nothing is removed
  // then. InvalidArgument for expert_weights without routed_experts.
  absl::StatusOr<rl::v1::GetEpisodeResponse> Export(absl::string_view episode_id,
                                                    const EpisodeExportOptions& options)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The fleet's weight version: episodes whose newest turn is at most version - k are dropped.
  void SetCurrentVersion(int64_t version) ABSL_LOCKS_EXCLUDED(mu_);
  EpisodeStats GetStats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Turn {
    EpisodeTurnRecord record;
    int32_t parent = -1;
  };
  struct Episode {
    std::vector<Turn> turns;
    int64_t tokens = 0;
    int64_t bytes = 0;
    int64_t newest_version = 0;
    std::chrono::steady_clock::time_point touched;
    std::list<std::string>::iterator lru;  // position in lru_
  };

  // The branch's routing (R3), assembled from its turns' (see Export).
  absl::Status AssembleRoutingLocked(absl::string_view episode_id, const Episode& e,
                                     const rl::v1::EpisodeSample& sample, bool weights,
                                     rl::v1::RoutedExperts* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLocked(absl::flat_hash_map<std::string, Episode>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the episodes idle for the ttl (O(dropped)).
  void CollectLocked(std::chrono::steady_clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EpisodeOptions options_;
  const Clock clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Episode> episodes_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // least recently touched first
  int64_t current_version_ ABSL_GUARDED_BY(mu_) = 0;
  EpisodeStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rl::router
