// StringMap: absl::flat_hash_map keyed by std::string with lookups by std::string_view (the
// Debian Abseil build has its own string_view type, so the default transparent hash does not
// accept std::string_view). Same cost and thread-safety as absl::flat_hash_map.
#pragma once

#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"

namespace rl::tokenizer {

struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return absl::Hash<std::string_view>{}(s); }
};

struct StringViewEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

template <typename V>
using StringMap = absl::flat_hash_map<std::string, V, StringViewHash, StringViewEq>;

}  // namespace rl::tokenizer
