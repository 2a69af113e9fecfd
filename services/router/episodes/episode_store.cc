#include "services/router/episodes/episode_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rl::router {
namespace {

// Whether `parent`'s whole trajectory (or all of it but a final stop token) is a prefix of
// `child`'s prompt.
bool Extends(const EpisodeTurnRecord& parent, const EpisodeTurnRecord& child) {
  const auto prefix_of_prompt = [&](size_t n) {
    return n <= static_cast<size_t>(child.prompt_tokens) &&
           std::equal(parent.tokens.begin(), parent.tokens.begin() + static_cast<ptrdiff_t>(n),
                      child.tokens.begin());
  };
  const size_t n = parent.tokens.size();
  if (prefix_of_prompt(n)) return true;
  const bool ends_on_stop_token = parent.finish_reason == rl::v1::FINISH_REASON_STOP &&
                                  parent.matched_token_id >= 0 && n > 0 &&
                                  static_cast<int32_t>(n) > parent.prompt_tokens &&
                                  parent.tokens.back() == parent.matched_token_id;
  return ends_on_stop_token && prefix_of_prompt(n - 1);
}

// Bounds on a routing's MoE layers and top-k (far above any model's), so sizes never overflow.
constexpr int32_t kMaxRoutingDim = 1 << 16;

// OK when `r` is a routing of `n` trajectory tokens: [tokens, layers, top_k] (layers and top_k at
// least 1), int32 ids (and float32 weights, or none) of that shape, positions within the
// trajectory.
absl::Status CheckRouting(const rl::v1::RoutedExperts& r, size_t n) {
  if (r.shape_size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape has ", r.shape_size(), " dims, expected [tokens, layers, top_k]"));
  }
  if (r.shape(0) < 0 || r.shape(1) < 1 || r.shape(2) < 1 || r.shape(1) > kMaxRoutingDim ||
      r.shape(2) > kMaxRoutingDim || r.start_pos() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("shape [", absl::StrJoin(r.shape(), ", "),
                                                   "] from start_pos ", r.start_pos()));
  }
  if (static_cast<int64_t>(r.start_pos()) + r.shape(0) > static_cast<int64_t>(n)) {
    return absl::InvalidArgumentError(absl::StrCat("tokens [", r.start_pos(), ", ",
                                                   r.start_pos() + r.shape(0),
                                                   ") past the trajectory's ", n));
  }
  const int64_t bytes = int64_t{4} * r.shape(0) * r.shape(1) * r.shape(2);
  if (static_cast<int64_t>(r.expert_ids().size()) != bytes ||
      (!r.expert_weights().empty() && static_cast<int64_t>(r.expert_weights().size()) != bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(r.expert_ids().size(), " id bytes and ",
                                                   r.expert_weights().size(), " weight bytes for ",
                                                   bytes / 4, " entries"));
  }
  return absl::OkStatus();
}

int64_t RoutingBytes(const std::optional<rl::v1::RoutedExperts>& r) {
  return r.has_value() ? static_cast<int64_t>(r->expert_ids().size() + r->expert_weights().size())
                       : 0;
}

}  // namespace

absl::Status ValidateEpisodeId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxEpisodeIdLen) {
    return absl::InvalidArgumentError(absl::StrCat("episode_id: must be 1 to ", kMaxEpisodeIdLen,
                                                   " characters (got ", id.size(), ")"));
  }
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.') {
      return absl::InvalidArgumentError(
          "episode_id: only letters, digits, '_' and '.' are allowed");
    }
  }
  return absl::OkStatus();
}

absl::Status EpisodeOptions::Validate() const {
  if (max_episodes < 1) return absl::InvalidArgumentError("--max-episodes: must be >= 1");
  if (max_turns < 1) return absl::InvalidArgumentError("--max-episode-turns: must be >= 1");
  if (max_episode_tokens < 1) {
    return absl::InvalidArgumentError("--max-episode-tokens: must be >= 1");
  }
  if (ttl.count() < 1) return absl::InvalidArgumentError("--episode-ttl-s: must be >= 1");
  if (gc_threshold_k < 0) return absl::InvalidArgumentError("--gc-threshold-k: must be >= 0");
  return absl::OkStatus();
}

EpisodeStore::EpisodeStore(const EpisodeOptions& options, Clock clock)
    : options_(options),
      clock_(clock ? std::move(clock) : Clock([] { return std::chrono::steady_clock::now(); })) {}

absl::Status EpisodeStore::Record(absl::string_view episode_id, EpisodeTurnRecord turn) {
  if (absl::Status s = ValidateEpisodeId(episode_id); !s.ok()) return s;
  const size_t n = turn.tokens.size();
  if (turn.mask.size() != n || turn.logprobs.size() != n || turn.versions.size() != n ||
      turn.prompt_tokens < 0 || static_cast<size_t>(turn.prompt_tokens) > n) {
    return absl::InvalidArgumentError("episode turn: inconsistent trajectory");
  }
  if (turn.routing.has_value()) {
    if (absl::Status s = CheckRouting(*turn.routing, n); !s.ok()) {
      // The turn is kept (its children still find their parent); an export with routing then
      // refuses its branches, naming the turn and this.
      turn.routing_note = absl::StrCat("its worker's routing did not fit: ", s.message());
      turn.routing.reset();
    }
  }
  const int64_t bytes =
      kEpisodeBytesPerToken * static_cast<int64_t>(n) + RoutingBytes(turn.routing);
  const auto now = clock_();
  absl::MutexLock lock(&mu_);
  CollectLocked(now);
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end()) {
    while (static_cast<int64_t>(episodes_.size()) >= options_.max_episodes) {
      DropLocked(episodes_.find(lru_.front()));
      ++stats_.collected;
    }
    it = episodes_.try_emplace(std::string(episode_id)).first;
    it->second.lru = lru_.insert(lru_.end(), it->first);
    it->second.touched = now;
  }
  Episode& e = it->second;
  // The token bound is inside the bytes one: every turn's bytes are at least
  // kEpisodeBytesPerToken per token, so e.bytes + bytes >= kEpisodeBytesPerToken x (e.tokens + n).
  if (static_cast<int64_t>(e.turns.size()) >= options_.max_turns ||
      (e.bytes + bytes + kEpisodeBytesPerToken - 1) / kEpisodeBytesPerToken >
          options_.max_episode_tokens) {
    ++stats_.refused_turns;
    return absl::ResourceExhaustedError(
        absl::StrCat("episode ", episode_id, " is full (", e.turns.size(), " turns, ", e.tokens,
                     " tokens, ", e.bytes, " bytes with routing; this turn ", n, " tokens, ", bytes,
                     " bytes; limits --max-episode-turns ", options_.max_turns,
                     ", --max-episode-tokens ", options_.max_episode_tokens, " (x ",
                     kEpisodeBytesPerToken, " bytes, routing included)): turn not recorded"));
  }
  Turn t;
  for (int32_t i = static_cast<int32_t>(e.turns.size()) - 1; i >= 0; --i) {
    if (Extends(e.turns[static_cast<size_t>(i)].record, turn)) {
      t.parent = i;
      break;
    }
  }
  e.tokens += static_cast<int64_t>(n);
  e.bytes += bytes;
  e.newest_version = std::max(e.newest_version, turn.weight_version);
  e.touched = now;
  lru_.splice(lru_.end(), lru_, e.lru);
  t.record = std::move(turn);
  e.turns.push_back(std::move(t));
  ++stats_.turns;
  ++stats_.recorded_turns;
  stats_.tokens += static_cast<int64_t>(n);
  stats_.bytes += bytes;
  return absl::OkStatus();
}

absl::StatusOr<rl::v1::GetEpisodeResponse> EpisodeStore::Export(absl::string_view episode_id,
                                                                bool remove) {
  return Export(episode_id, EpisodeExportOptions{.remove = remove});
}

absl::StatusOr<rl::v1::GetEpisodeResponse> EpisodeStore::Export(
    absl::string_view episode_id, const EpisodeExportOptions& options) {
  if (absl::Status s = ValidateEpisodeId(episode_id); !s.ok()) return s;
  if (options.expert_weights && !options.routed_experts) {
    return absl::InvalidArgumentError("return_expert_weights: needs return_routed_experts");
  }
  const auto now = clock_();
  absl::MutexLock lock(&mu_);
  CollectLocked(now);
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "episode ", episode_id,
        ": not held (never recorded, removed, or collected by age or weight version)"));
  }
  Episode& e = it->second;
  e.touched = now;
  lru_.splice(lru_.end(), lru_, e.lru);
  rl::v1::GetEpisodeResponse out;
  out.set_episode_id(std::string(episode_id));
  std::vector<bool> has_child(e.turns.size(), false);
  for (const Turn& t : e.turns) {
    if (t.parent >= 0) has_child[static_cast<size_t>(t.parent)] = true;
  }
  for (size_t i = 0; i < e.turns.size(); ++i) {
    const EpisodeTurnRecord& r = e.turns[i].record;
    rl::v1::EpisodeTurn* pt = out.add_turns();
    pt->set_request_id(r.request_id);
    pt->set_index(r.index);
    pt->set_parent(e.turns[i].parent);
    pt->set_prompt_tokens(r.prompt_tokens);
    pt->set_completion_tokens(static_cast<int32_t>(r.tokens.size()) - r.prompt_tokens);
    pt->set_worker(r.worker);
    pt->set_weight_version(r.weight_version);
    pt->set_finish_reason(r.finish_reason);
    pt->set_has_routed_experts(r.routing.has_value());
    if (has_child[i]) continue;
    rl::v1::EpisodeSample* sample = out.add_samples();
    rl::v1::Trajectory* tr = sample->mutable_trajectory();
    tr->mutable_tokens()->Assign(r.tokens.begin(), r.tokens.end());
    for (uint8_t m : r.mask) tr->add_loss_mask(m);
    tr->mutable_rollout_logp()->Assign(r.logprobs.begin(), r.logprobs.end());
    tr->mutable_token_weight_versions()->Assign(r.versions.begin(), r.versions.end());
    tr->set_weight_version(r.versions.empty()
                               ? r.weight_version
                               : *std::max_element(r.versions.begin(), r.versions.end()));
    std::vector<int32_t> path;
    for (int32_t j = static_cast<int32_t>(i); j >= 0; j = e.turns[static_cast<size_t>(j)].parent) {
      path.push_back(j);
    }
    sample->mutable_turns()->Assign(path.rbegin(), path.rend());
    if (options.routed_experts) {
      absl::Status s = AssembleRoutingLocked(episode_id, e, *sample, options.expert_weights,
                                             sample->mutable_routed_experts());
      if (!s.ok()) return s;
    }
  }
  ++stats_.exports;
  stats_.exported_samples += out.samples_size();
  if (options.remove) {
    DropLocked(it);
    ++stats_.removed;
  }
  return out;
}

absl::Status EpisodeStore::AssembleRoutingLocked(absl::string_view episode_id, const Episode& e,
                                                 const rl::v1::EpisodeSample& sample, bool weights,
                                                 rl::v1::RoutedExperts* out) const {
  // The branch's turns root first; each turn's routing is over its own trajectory, whose first
  // tokens are its parent's: a turn adds the rows from where the routing so far ends (the
  // tokens it re-sends keep the routing computed when they were first processed).
  const auto where = [&](int32_t j, const EpisodeTurnRecord& r) {
    return absl::StrCat("episode ", episode_id, ", branch of turns [",
                        absl::StrJoin(sample.turns(), ", "), "]: turn ", j, " (request ",
                        r.request_id, ", index ", r.index, ")");
  };
  int64_t start = 0, end = 0, width = 0;
  std::string ids, wts;
  for (int k = 0; k < sample.turns_size(); ++k) {
    const int32_t j = sample.turns(k);
    const EpisodeTurnRecord& r = e.turns[static_cast<size_t>(j)].record;
    if (!r.routing.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where(j, r), " was recorded without routing (",
          r.routing_note.empty() ? "sent without return_routed_experts, or its worker returned "
                                   "none: a dense model or no --enable-return-routed-experts"
                                 : r.routing_note,
          "): the branch has no routing to export"));
    }
    const rl::v1::RoutedExperts& g = *r.routing;
    const int64_t w = int64_t{g.shape(1)} * g.shape(2);
    if (weights && g.expert_weights().empty() && g.shape(0) > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(where(j, r),
                       " was recorded without expert weights (sent without "
                       "return_expert_weights): ask for the routed experts alone"));
    }
    if (k == 0) {
      start = end = g.start_pos();
      out->add_shape(0);
      out->add_shape(g.shape(1));
      out->add_shape(g.shape(2));
      width = w;
    } else if (g.shape(1) != out->shape(1) || g.shape(2) != out->shape(2)) {
      return absl::FailedPreconditionError(absl::StrCat(
          where(j, r), " has routing of ", g.shape(1), " MoE layers x top-", g.shape(2),
          ", the branch's earlier turns ", out->shape(1), " x top-", out->shape(2)));
    }
    const int64_t first = g.start_pos(), last = first + g.shape(0);
    if (first > end) {
      return absl::FailedPreconditionError(
          absl::StrCat(where(j, r), "'s routing starts at token ", first,
                       ", after the branch's routing so far ends (token ", end,
                       "): tokens between have none (routed_experts_start_len?)"));
    }
    if (last > end) {
      const size_t from = static_cast<size_t>((end - first) * width) * 4;
      const size_t len = static_cast<size_t>((last - end) * width) * 4;
      ids.append(g.expert_ids(), from, len);
      if (weights) wts.append(g.expert_weights(), from, len);
      end = last;
    }
  }
  out->set_start_pos(static_cast<int32_t>(start));
  out->set_shape(0, static_cast<int32_t>(end - start));
  out->set_expert_ids(std::move(ids));
  if (weights) out->set_expert_weights(std::move(wts));
  return absl::OkStatus();
}

void EpisodeStore::SetCurrentVersion(int64_t version) {
  const auto now = clock_();
  absl::MutexLock lock(&mu_);
  current_version_ = version;
  CollectLocked(now);
  if (current_version_ - options_.gc_threshold_k <= 0) return;
  for (auto it = episodes_.begin(); it != episodes_.end();) {
    auto next = std::next(it);  // erasing leaves the other iterators valid
    if (it->second.newest_version <= current_version_ - options_.gc_threshold_k) {
      DropLocked(it);
      ++stats_.collected;
    }
    it = next;
  }
}

EpisodeStats EpisodeStore::GetStats() const {
  absl::MutexLock lock(&mu_);
  EpisodeStats s = stats_;
  s.episodes = static_cast<int64_t>(episodes_.size());
  return s;
}

void EpisodeStore::DropLocked(absl::flat_hash_map<std::string, Episode>::iterator it) {
  stats_.turns -= static_cast<int64_t>(it->second.turns.size());
  stats_.tokens -= it->second.tokens;
  stats_.bytes -= it->second.bytes;
  lru_.erase(it->second.lru);
  episodes_.erase(it);
}

void EpisodeStore::CollectLocked(std::chrono::steady_clock::time_point now) {
  // lru_ is ordered by last touch: the idle ones are at its front.
  while (!lru_.empty()) {
    auto it = episodes_.find(lru_.front());
    if (now - it->second.touched < options_.ttl) break;
    DropLocked(it);
    ++stats_.collected;
  }
}

}  // namespace rl::router
