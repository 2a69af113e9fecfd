// The text cache's lookups: the children a query may follow, the search of every cached path it
// follows for the best end per MatchGoal (docs/text-cache.md), and the copy of the result.
#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "common/check.h"
#include "services/router/cache/text_cache.h"
#include "services/router/cache/text_cache_internal.h"

namespace rl::router {

using text_cache_internal::CommonPrefix;
using text_cache_internal::ExpandRuns;
using text_cache_internal::IsUtf8Continuation;

void TextCache::FindChildren(const Node* parent, std::string_view rest,
                             std::vector<const Node*>* out) {
  const auto& children = parent->children;
  auto end = children.end();
  // The keys that are prefixes of `rest` form a chain; the longest is the last key <= rest.
  // Each step looks for the next shorter one among the keys before the last one seen.
  while (!rest.empty()) {
    auto it = std::upper_bound(children.begin(), end, rest,
                               [](std::string_view r, const std::unique_ptr<Node>& child) {
                                 return r < child->FirstGroup();
                               });
    if (it == children.begin()) return;
    --it;
    const std::string_view key = (*it)->FirstGroup();
    const size_t common = CommonPrefix(key, rest);
    if (common == key.size()) {
      out->push_back(it->get());
      rest = rest.substr(0, key.size() - 1);
    } else {
      rest = rest.substr(0, common);
    }
    end = it;
  }
}

void TextCache::MatchLocked(std::string_view query, MatchGoal goal, CacheMatch* out) const {
  // Search every cached path the query follows (siblings' first groups may be prefixes of one
  // another) for the best end per `goal`; the first found (longest first groups first) on a
  // tie.
  struct State {
    const Node* node;
    size_t pos;      // bytes matched through node's edge
    size_t gen_end;  // end of the last generated token on the path (0: none)
  };
  struct Best {
    const Node* node = nullptr;
    size_t take = 0;  // tokens of node's edge in the match
    size_t pos = 0;
    size_t gen_end = 0;
    bool terminal = false;
  } best;
  const auto score = [goal](size_t gen_end, size_t pos, bool terminal) {
    return goal == MatchGoal::kLongest ? std::make_tuple(pos, gen_end, size_t{terminal})
                                       : std::make_tuple(gen_end, size_t{terminal}, pos);
  };
  std::vector<State> stack = {{root_.get(), 0, 0}};
  std::vector<const Node*> candidates;
  size_t visited = 0;
  while (!stack.empty() && visited < kMaxMatchNodes) {
    const State s = stack.back();
    stack.pop_back();
    if (s.pos == query.size()) continue;
    const std::string_view rest = query.substr(s.pos);
    candidates.clear();
    FindChildren(s.node, rest, &candidates);
    const size_t stack_size = stack.size();
    for (const Node* child : candidates) {  // longest first group first
      ++visited;
      const size_t common = CommonPrefix(child->text(), rest);
      const uint32_t* e = child->ends();
      // Tokens whose spans lie inside the common text; the first group always does.
      const size_t take =
          common == child->num_bytes
              ? child->num_tokens
              : static_cast<size_t>(std::upper_bound(e, e + child->num_tokens, common) - e);
      RL_CHECK(take > 0);
      size_t gen_end = s.gen_end;
      for (size_t i = take; i > 0; --i) {
        if (child->mask()[i - 1] == 1) {
          gen_end = s.pos + e[i - 1];
          break;
        }
      }
      const size_t end = s.pos + e[take - 1];
      const bool full = take == child->num_tokens;
      const bool terminal = full && !child->path_runs.empty();
      if (score(gen_end, end, terminal) > score(best.gen_end, best.pos, best.terminal)) {
        best = {child, take, end, gen_end, terminal};
      }
      if (full) stack.push_back({child, end, gen_end});
    }
    // Longest first group on top of the stack.
    std::reverse(stack.begin() + static_cast<std::ptrdiff_t>(stack_size), stack.end());
  }
  // The chosen path, root first.
  std::vector<const Node*> path;
  for (const Node* n = best.node; n != nullptr && n != root_.get(); n = n->parent) {
    path.push_back(n);
  }
  std::reverse(path.begin(), path.end());
  size_t pos = 0;
  // (tokens before the edge, its version) per matched edge, for weight_version after back-off.
  std::vector<std::pair<size_t, int64_t>> edges;
  // The deepest fully matched node where a trajectory ended, and the tokens up to it.
  const Node* terminal = nullptr;
  size_t terminal_tokens = 0;
  std::vector<size_t> path_tokens;  // tokens through each node of `path`
  path_tokens.reserve(path.size());
  for (const Node* child : path) {
    const uint32_t* e = child->ends();
    const size_t take = child == best.node ? best.take : child->num_tokens;
    const size_t old = out->tokens.size();
    out->tokens.insert(out->tokens.end(), child->ids(), child->ids() + take);
    out->loss_mask.insert(out->loss_mask.end(), child->mask(), child->mask() + take);
    out->logprobs.resize(old + take);
    std::memcpy(out->logprobs.data() + old, child->logprob_bits(), take * sizeof(float));
    child->AppendVersions(0, static_cast<uint32_t>(take), &out->token_versions);
    out->token_end_offsets.resize(old + take);
    for (size_t i = 0; i < take; ++i) {
      out->token_end_offsets[old + i] = static_cast<uint32_t>(pos + e[i]);
    }
    edges.emplace_back(old, child->version);
    path_tokens.push_back(out->tokens.size());
    pos += e[take - 1];
    if (take == child->num_tokens && !child->path_runs.empty()) {
      terminal = child;
      terminal_tokens = out->tokens.size();
    }
  }
  if (options_.utf8_safe_match) {
    // Back off group by group while the rest would start inside a UTF-8 character.
    while (pos > 0 && pos < query.size() && IsUtf8Continuation(query[pos])) {
      while (!out->token_end_offsets.empty() && out->token_end_offsets.back() >= pos) {
        out->token_end_offsets.pop_back();
      }
      pos = out->token_end_offsets.empty() ? 0 : out->token_end_offsets.back();
    }
    if (pos == 0) out->token_end_offsets.clear();
    const size_t keep = out->token_end_offsets.size();
    out->tokens.resize(keep);
    out->loss_mask.resize(keep);
    out->logprobs.resize(keep);
    out->token_versions.resize(keep);
  }
  // Versions through the deepest trajectory end are that trajectory's own.
  if (terminal != nullptr) {
    ExpandRuns(terminal->path_runs, std::min(terminal_tokens, out->tokens.size()),
               out->token_versions.data());
  }
  out->matched_bytes = pos;
  while (!edges.empty() && edges.back().first >= out->tokens.size()) edges.pop_back();
  out->weight_version = edges.empty() ? 0 : edges.back().second;
  HoldersLocked(path, path_tokens, out);
}

void TextCache::HoldersLocked(const std::vector<const Node*>& path,
                              const std::vector<size_t>& tokens, CacheMatch* out) const {
  if (worker_slots_.empty()) return;
  // Per slot, the tokens through the deepest node it served (at the current version).
  uint32_t held[kMaxCacheWorkers] = {};
  uint64_t any = 0;
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i]->version < current_version_) continue;  // older KV: flushed from every worker
    const uint32_t t = static_cast<uint32_t>(std::min(tokens[i], out->tokens.size()));
    for (uint64_t bits = path[i]->workers; bits != 0; bits &= bits - 1) {
      const int slot = __builtin_ctzll(bits);
      held[slot] = t;
      any |= uint64_t{1} << slot;
    }
  }
  for (uint64_t bits = any; bits != 0; bits &= bits - 1) {
    const int slot = __builtin_ctzll(bits);
    if (held[slot] > 0)
      out->holders.push_back({worker_slots_[static_cast<size_t>(slot)], held[slot]});
  }
  std::stable_sort(out->holders.begin(), out->holders.end(),
                   [](const CacheHolder& a, const CacheHolder& b) { return a.tokens > b.tokens; });
}

CacheMatch TextCache::Match(std::string_view query, MatchGoal goal) const {
  CacheMatch out;
  {
    absl::ReaderMutexLock lock(&mu_);
    MatchLocked(query, goal, &out);
  }
  if (out.tokens.empty()) {
    misses_.fetch_add(1, std::memory_order_relaxed);
  } else {
    hits_.fetch_add(1, std::memory_order_relaxed);
  }
  return out;
}

CacheRetrieval TextCache::Retrieve(std::string_view text) const {
  CacheMatch match = Match(text);
  CacheRetrieval out;
  out.matched_bytes = match.matched_bytes;
  out.tokens = std::move(match.tokens);
  out.loss_mask = std::move(match.loss_mask);
  out.rollout_logp = std::move(match.logprobs);
  out.token_versions = std::move(match.token_versions);
  out.weight_version = match.weight_version;
  return out;
}

}  // namespace rl::router
