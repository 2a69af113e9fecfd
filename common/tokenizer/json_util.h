// Typed, non-throwing accessors for the nlohmann::json objects of tokenizer.json.
//
// Every accessor checks the JSON type first and returns InvalidArgument naming the field
// (`where` is a path such as "model.merges[3]"), so a malformed file is a clear error and
// no nlohmann exception can escape. Header-only; each call is O(1) apart from the lookup.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace rl::tokenizer::json_util {

using Json = nlohmann::json;

inline absl::Status TypeError(const std::string& where, const std::string& expected,
                              const Json& got) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: ", where, " must be ", expected, ", got ", got.type_name()));
}

// The member `key` of object `obj`, or nullptr when absent or null.
inline const Json* Find(const Json& obj, const std::string& key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

inline absl::StatusOr<std::string> GetString(const Json& obj, const std::string& key,
                                             const std::string& where) {
  const Json* v = Find(obj, key);
  const std::string path = absl::StrCat(where, ".", key);
  if (v == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: missing ", path));
  if (!v->is_string()) return TypeError(path, "a string", *v);
  return v->get<std::string>();
}

inline absl::StatusOr<std::string> GetStringOr(const Json& obj, const std::string& key,
                                               const std::string& where, std::string dflt) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return dflt;
  if (!v->is_string()) return TypeError(absl::StrCat(where, ".", key), "a string", *v);
  return v->get<std::string>();
}

inline absl::StatusOr<bool> GetBoolOr(const Json& obj, const std::string& key,
                                      const std::string& where, bool dflt) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return dflt;
  if (!v->is_boolean()) return TypeError(absl::StrCat(where, ".", key), "a boolean", *v);
  return v->get<bool>();
}

inline absl::StatusOr<int64_t> GetIntOr(const Json& obj, const std::string& key,
                                        const std::string& where, int64_t dflt) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return dflt;
  if (!v->is_number_integer()) return TypeError(absl::StrCat(where, ".", key), "an integer", *v);
  return v->get<int64_t>();
}

inline absl::StatusOr<const Json*> GetArray(const Json& obj, const std::string& key,
                                            const std::string& where) {
  const Json* v = Find(obj, key);
  const std::string path = absl::StrCat(where, ".", key);
  if (v == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: missing ", path));
  if (!v->is_array()) return TypeError(path, "an array", *v);
  return v;
}

// The "type" member of a component object.
inline absl::StatusOr<std::string> GetType(const Json& obj, const std::string& where) {
  if (!obj.is_object()) return TypeError(where, "an object", obj);
  return GetString(obj, "type", where);
}

inline absl::Status UnknownType(const std::string& kind, const std::string& type) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: unsupported ", kind, " type '", type, "'"));
}

// A Replace/Split "pattern" object: {"String": s} or {"Regex": r}.
struct Pattern {
  bool is_regex = false;
  std::string value;
};

inline absl::StatusOr<Pattern> GetPattern(const Json& obj, const std::string& where) {
  const Json* p = Find(obj, "pattern");
  const std::string path = absl::StrCat(where, ".pattern");
  if (p == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: missing ", path));
  if (!p->is_object()) return TypeError(path, "an object", *p);
  Pattern out;
  if (const Json* s = Find(*p, "String")) {
    if (!s->is_string()) return TypeError(absl::StrCat(path, ".String"), "a string", *s);
    out.value = s->get<std::string>();
    return out;
  }
  if (const Json* r = Find(*p, "Regex")) {
    if (!r->is_string()) return TypeError(absl::StrCat(path, ".Regex"), "a string", *r);
    out.is_regex = true;
    out.value = r->get<std::string>();
    return out;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: ", path, " needs a \"String\" or \"Regex\" member"));
}

}  // namespace rl::tokenizer::json_util
