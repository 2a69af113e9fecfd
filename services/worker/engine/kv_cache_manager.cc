#include "services/worker/engine/kv_cache_manager.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace rl::engine {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

KvCacheManager::KvCacheManager(int64_t num_kv_slots, int32_t page_size, int32_t num_rows,
                               int32_t row_len)
    : page_size_(page_size),
      pool_(num_kv_slots, page_size),
      req_to_token_(num_rows, row_len),
      tree_(page_size) {}

RadixCache::MatchResult KvCacheManager::Match(int64_t version, absl::Span<const int32_t> tokens) {
  return tree_.Match(version, tokens);
}

bool KvCacheManager::Admit(Sequence* seq, const RadixCache::MatchResult& m, int64_t version) {
  std::optional<int32_t> row = req_to_token_.Alloc();
  if (!row.has_value()) return false;
  const int32_t ps = page_size_;
  seq->row = *row;
  tree_.Lock(m.last_node);
  seq->last_node = m.last_node;
  absl::Span<int32_t> r = req_to_token_.row(seq->row);
  for (int64_t p = 0; p < m.num_tokens; ++p) {
    r[p] = m.pages[p / ps] * ps + static_cast<int32_t>(p % ps);
  }
  seq->cached_len = seq->num_computed = seq->num_allocated = m.num_tokens;
  seq->kv_version = version;
  return true;
}

bool KvCacheManager::EnsureFreePages(int64_t num_pages) {
  const int64_t missing = num_pages - pool_.num_free_pages();
  if (missing <= 0) return true;
  std::vector<int32_t> evicted;
  tree_.Evict(missing, &evicted);
  pool_.Free(evicted);
  return pool_.num_free_pages() >= num_pages;
}

int64_t KvCacheManager::PagesToGrow(const Sequence& seq, int64_t new_len) const {
  return CeilDiv(new_len, page_size_) - CeilDiv(seq.num_allocated, page_size_);
}

bool KvCacheManager::Grow(Sequence* seq, int64_t new_len) {
  const int32_t ps = page_size_;
  const int64_t need = PagesToGrow(*seq, new_len);
  if (!EnsureFreePages(need)) return false;
  scratch_pages_.clear();
  RL_CHECK(pool_.Alloc(need, &scratch_pages_));
  absl::Span<int32_t> row = req_to_token_.row(seq->row);
  const int64_t have_pages = CeilDiv(seq->num_allocated, ps);
  for (int64_t p = seq->num_allocated; p < new_len; ++p) {
    const int64_t pi = p / ps;
    const int32_t page = pi < have_pages ? row[pi * ps] / ps : scratch_pages_[pi - have_pages];
    row[p] = page * ps + static_cast<int32_t>(p % ps);
  }
  seq->num_allocated = new_len;
  return true;
}

void KvCacheManager::AppendOwnPages(const Sequence& seq, std::vector<int32_t>* pages) const {
  const int32_t ps = page_size_;
  absl::Span<const int32_t> row = req_to_token_.row(seq.row);
  for (int64_t pi = seq.cached_len / ps; pi < CeilDiv(seq.num_allocated, ps); ++pi) {
    pages->push_back(row[pi * ps] / ps);
  }
}

void KvCacheManager::Release(Sequence* seq, bool cache) {
  if (seq->row < 0) return;
  const int32_t ps = page_size_;
  absl::Span<int32_t> row = req_to_token_.row(seq->row);
  const int64_t n = seq->num_computed / ps * ps;
  if (cache && n > seq->cached_len) {
    InsertComputed(*seq, n);
    for (int64_t pi = n / ps; pi < CeilDiv(seq->num_allocated, ps); ++pi) {
      pool_.Free(row[pi * ps] / ps);
    }
  } else {
    std::vector<int32_t> own;
    AppendOwnPages(*seq, &own);
    pool_.Free(own);
  }
  tree_.Unlock(seq->last_node);
  seq->last_node = nullptr;
  req_to_token_.Free(seq->row);
  seq->row = -1;
  seq->cached_len = 0;
  seq->num_computed = 0;
  seq->num_allocated = 0;
}

void KvCacheManager::CacheUnfinished(Sequence* seq) {
  const int32_t ps = page_size_;
  const int64_t n = seq->num_computed / ps * ps;
  if (n <= seq->cached_len) return;
  InsertComputed(*seq, n);
  absl::Span<int32_t> row = req_to_token_.row(seq->row);
  const auto key = absl::MakeConstSpan(seq->tokens.data(), n);
  RadixCache::MatchResult m = tree_.Match(seq->kv_version, key);
  RL_CHECK(m.num_tokens == n);
  for (int64_t p = 0; p < n; ++p) row[p] = m.pages[p / ps] * ps + static_cast<int32_t>(p % ps);
  tree_.Lock(m.last_node);
  tree_.Unlock(seq->last_node);
  seq->last_node = m.last_node;
  seq->cached_len = n;
}

void KvCacheManager::InsertComputed(const Sequence& seq, int64_t n) {
  const int32_t ps = page_size_;
  absl::Span<const int32_t> row = req_to_token_.row(seq.row);
  std::vector<int32_t> pages;
  pages.reserve(n / ps);
  for (int64_t pi = 0; pi < n / ps; ++pi) pages.push_back(row[pi * ps] / ps);
  std::vector<int32_t> duplicates;
  tree_.Insert(seq.kv_version, absl::MakeConstSpan(seq.tokens.data(), n), pages, &duplicates);
  pool_.Free(duplicates);
}

void KvCacheManager::EvictUnlocked() {
  std::vector<int32_t> evicted;
  tree_.Evict(tree_.cached_tokens() / page_size_ + 1, &evicted);
  pool_.Free(evicted);
}

void KvCacheManager::Reset() {
  std::vector<int32_t> pages;
  tree_.Reset(&pages);
  pool_.Reset();
  req_to_token_.Reset();
}

absl::Status KvCacheManager::CheckInvariants(absl::Span<const Sequence* const> running) const {
  const int32_t ps = page_size_;
  int64_t own = 0;
  for (const Sequence* s : running) {
    if (s->row < 0) return absl::InternalError(absl::StrCat(s->request().id, " has no row"));
    if (s->cached_len > s->num_computed || s->num_computed > s->num_allocated ||
        s->cached_len % ps != 0) {
      return absl::InternalError(absl::StrCat(s->request().id, " has inconsistent KV lengths"));
    }
    own += CeilDiv(s->num_allocated, ps) - s->cached_len / ps;
  }
  const int64_t tree_pages = tree_.cached_tokens() / ps;
  if (pool_.num_free_pages() + tree_pages + own != pool_.num_pages()) {
    return absl::InternalError(absl::StrCat("page leak: free ", pool_.num_free_pages(),
                                            " + cached ", tree_pages, " + owned ", own,
                                            " != total ", pool_.num_pages()));
  }
  if (req_to_token_.num_used() != static_cast<int32_t>(running.size())) {
    return absl::InternalError(absl::StrCat("req_to_token leak: ", req_to_token_.num_used(),
                                            " rows used by ", running.size(), " sequences"));
  }
  return absl::OkStatus();
}

}  // namespace rl::engine
