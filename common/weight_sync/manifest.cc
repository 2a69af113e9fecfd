#include "common/weight_sync/manifest.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_io/file_read.h"
#include "common/sha256.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace rl::weight_sync {
namespace {

using Json = nlohmann::json;

absl::Status Bad(absl::string_view source, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", field, " ", what));
}

bool IsHexDigest(const Json& j) {
  if (!j.is_string()) return false;
  const std::string& s = j.get_ref<const std::string&>();
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string Short(absl::string_view hex) { return std::string(hex.substr(0, 12)); }

absl::StatusOr<Manifest> FromJson(const Json& j, absl::string_view source) {
  if (!j.is_object()) return Bad(source, "manifest", "is not a JSON object");
  auto format = j.find("format");
  if (format == j.end() || !format->is_string() || *format != kManifestFormat) {
    return Bad(source, "format", absl::StrCat("must be \"", kManifestFormat, "\""));
  }
  Manifest m;
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() < 0) {
    return Bad(source, "version", "must be an integer >= 0");
  }
  m.version = version->get<int64_t>();
  if (auto p = j.find("parent_version"); p != j.end() && !p->is_null()) {
    if (!p->is_number_integer() || p->get<int64_t>() < 0 || p->get<int64_t>() >= m.version) {
      return Bad(source, "parent_version", "must be an integer in [0, version)");
    }
    m.parent_version = p->get<int64_t>();
  }
  if (auto p = j.find("parent_sha256"); p != j.end() && !p->is_null()) {
    if (!IsHexDigest(*p)) return Bad(source, "parent_sha256", "must be 64 lower-case hex digits");
    if (!m.parent_version) return Bad(source, "parent_sha256", "needs parent_version");
    m.parent_sha256 = p->get<std::string>();
  }
  auto digest = j.find("sha256");
  if (digest == j.end() || !IsHexDigest(*digest)) {
    return Bad(source, "sha256", "must be 64 lower-case hex digits");
  }
  auto tensors = j.find("tensors");
  if (tensors == j.end() || !tensors->is_object()) {
    return Bad(source, "tensors", "must be an object of name -> {dtype, shape, sha256}");
  }
  if (static_cast<int64_t>(tensors->size()) > kMaxManifestTensors) {
    return Bad(
        source, "tensors",
        absl::StrCat("lists ", tensors->size(), " tensors (at most ", kMaxManifestTensors, ")"));
  }
  for (const auto& [name, t] : tensors->items()) {
    const std::string field = absl::StrCat("tensors[", name.substr(0, 128), "]");
    if (name.empty() || name.size() > kMaxTensorNameBytes) {
      return Bad(source, field, absl::StrCat("name must be 1..", kMaxTensorNameBytes, " bytes"));
    }
    if (!t.is_object()) return Bad(source, field, "must be an object");
    ManifestEntry e;
    auto dtype = t.find("dtype");
    std::optional<model_io::DType> parsed;
    if (dtype != t.end() && dtype->is_string()) {
      parsed = model_io::ParseDType(dtype->get_ref<const std::string&>());
    }
    if (!parsed || !model_io::IsFloatWeightDType(*parsed)) {
      return Bad(source, field + ".dtype", "must be F32, BF16 or F16");
    }
    e.dtype = *parsed;
    auto shape = t.find("shape");
    if (shape == t.end() || !shape->is_array() ||
        static_cast<int>(shape->size()) > kMaxManifestRank) {
      return Bad(source, field + ".shape",
                 absl::StrCat("must be a list of at most ", kMaxManifestRank, " dimensions"));
    }
    for (const Json& d : *shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return Bad(source, field + ".shape", "dimensions must be integers >= 0");
      }
      e.shape.push_back(d.get<int64_t>());
    }
    if (!model_io::CheckedNumElements(e.shape).ok()) {
      return Bad(source, field + ".shape", "has too many elements");
    }
    auto sha = t.find("sha256");
    if (sha == t.end() || !IsHexDigest(*sha)) {
      return Bad(source, field + ".sha256", "must be 64 lower-case hex digits");
    }
    e.sha256 = sha->get<std::string>();
    m.tensors.emplace(name, std::move(e));
  }
  m.sha256 = ManifestDigest(m.tensors);
  if (m.sha256 != digest->get_ref<const std::string&>()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": sha256 ", Short(digest->get_ref<const std::string&>()),
                     "... is not the digest of the tensors listed (", Short(m.sha256),
                     "...): the manifest was edited or cut"));
  }
  return m;
}

Json ToJson(const Manifest& m) {
  Json tensors = Json::object();
  for (const auto& [name, e] : m.tensors) {
    tensors[name] = {
        {"dtype", model_io::DTypeName(e.dtype)}, {"shape", e.shape}, {"sha256", e.sha256}};
  }
  Json j = {{"format", kManifestFormat}, {"version", m.version}};
  if (m.parent_version) j["parent_version"] = *m.parent_version;
  if (!m.parent_sha256.empty()) j["parent_sha256"] = m.parent_sha256;
  j["sha256"] = m.sha256;
  j["tensors"] = std::move(tensors);
  return j;
}

absl::Status WriteAtomically(const std::string& path, absl::string_view text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_errno = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(write_errno)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string TensorSha256(absl::string_view name, absl::string_view dtype,
                         absl::Span<const int64_t> shape, absl::Span<const uint8_t> bytes) {
  Sha256 h;
  const char zero = '\0';
  h.Update(name.data(), name.size());
  h.Update(&zero, 1);
  h.Update(dtype.data(), dtype.size());
  h.Update(&zero, 1);
  h.Update(absl::StrJoin(shape, ","));
  h.Update(&zero, 1);
  h.Update(bytes.data(), bytes.size());
  return ToHex(h.Final());
}

std::string ManifestDigest(const std::map<std::string, ManifestEntry>& tensors) {
  Sha256 h;
  for (const auto& [name, e] : tensors) h.Update(absl::StrCat(name, ":", e.sha256, "\n"));
  return ToHex(h.Final());
}

absl::StatusOr<Manifest> ParseManifest(absl::string_view text, absl::string_view source) {
  if (static_cast<int64_t>(text.size()) > kMaxManifestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", text.size(), " bytes (a manifest is at most ", kMaxManifestBytes, ")"));
  }
  RETURN_IF_ERROR(model_io::CheckJsonDepth(text, model_io::kMaxJsonDepth, source));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not JSON"));
  return FromJson(j, source);
}

std::string ManifestToJson(const Manifest& manifest) { return ToJson(manifest).dump(1); }

absl::StatusOr<std::optional<Manifest>> ReadManifest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kManifestFileName).string();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) return std::nullopt;
  ASSIGN_OR_RETURN(std::string text, model_io::ReadSmallFile(path, kMaxManifestBytes));
  ASSIGN_OR_RETURN(Manifest m, ParseManifest(text, path));
  return m;
}

absl::Status WriteManifest(const std::string& dir, const Manifest& manifest) {
  return WriteAtomically((std::filesystem::path(dir) / kManifestFileName).string(),
                         ManifestToJson(manifest));
}

Manifest ManifestOfCheckpoint(const model_io::Checkpoint& checkpoint, int64_t version,
                              std::optional<int64_t> parent_version, std::string parent_sha256) {
  Manifest m;
  m.version = version;
  m.parent_version = parent_version;
  m.parent_sha256 = std::move(parent_sha256);
  for (const auto& [name, view] : checkpoint.tensors()) {
    if (!model_io::IsFloatWeightDType(view.dtype)) continue;  // never served
    ManifestEntry e;
    e.dtype = view.dtype;
    e.shape = view.shape;
    e.sha256 = TensorSha256(name, model_io::DTypeName(view.dtype), view.shape, view.data);
    m.tensors.emplace(name, std::move(e));
  }
  m.sha256 = ManifestDigest(m.tensors);
  return m;
}

absl::Status CheckTensorAgainstManifest(const Manifest& manifest, const std::string& name,
                                        absl::string_view dtype, absl::Span<const int64_t> shape,
                                        absl::Span<const uint8_t> bytes) {
  auto it = manifest.tensors.find(name);
  if (it == manifest.tensors.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", name, "' is not in the manifest of version ", manifest.version));
  }
  const ManifestEntry& e = it->second;
  if (dtype != model_io::DTypeName(e.dtype) ||
      !std::equal(shape.begin(), shape.end(), e.shape.begin(), e.shape.end())) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", name, "' is ", dtype, "[", absl::StrJoin(shape, ", "),
                     "] but the manifest of version ", manifest.version, " says ",
                     model_io::DTypeName(e.dtype), "[", absl::StrJoin(e.shape, ", "), "]"));
  }
  const std::string got = TensorSha256(name, dtype, shape, bytes);
  if (got != e.sha256) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", name, "' does not match the manifest of version ", manifest.version,
        " (sha256 ", Short(got), "... vs ", Short(e.sha256), "...)"));
  }
  return absl::OkStatus();
}

}  // namespace rl::weight_sync
