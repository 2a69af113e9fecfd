#include "common/weight_sync/delta_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/model_io/safetensors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace rl::weight_sync {
namespace {

using Json = nlohmann::json;

constexpr char kMagic[8] = {'R', 'L', 'D', 'E', 'L', 'T', 'A', '1'};
constexpr size_t kPrefixBytes = 16;

absl::Status Bad(const std::string& source, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

}  // namespace

absl::StatusOr<DeltaFile> ParseDeltaFile(absl::Span<const uint8_t> bytes,
                                         const std::string& source) {
  if (bytes.size() < kPrefixBytes || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    return Bad(source, "not a delta file (no RLDELTA1 magic, or cut before it)");
  }
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(bytes[8 + i]) << (8 * i);
  if (header_len > static_cast<uint64_t>(kMaxDeltaHeaderBytes) ||
      header_len > bytes.size() - kPrefixBytes) {
    return Bad(source,
               absl::StrCat("header of ", header_len, " bytes does not fit the file's ",
                            bytes.size(), " bytes (cut, or at most ", kMaxDeltaHeaderBytes, ")"));
  }
  const absl::string_view text(reinterpret_cast<const char*>(bytes.data() + kPrefixBytes),
                               header_len);
  RETURN_IF_ERROR(model_io::CheckJsonDepth(text, model_io::kMaxJsonDepth, source));
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad(source, "header is not a JSON object");
  if (auto f = j.find("format"); f == j.end() || !f->is_string() || *f != kDeltaFormat) {
    return Bad(source, absl::StrCat("format must be \"", kDeltaFormat, "\""));
  }
  auto m = j.find("manifest");
  if (m == j.end() || !m->is_object()) return Bad(source, "manifest: missing");
  DeltaFile out;
  ASSIGN_OR_RETURN(out.manifest, ParseManifest(m->dump(), absl::StrCat(source, " manifest")));
  if (!out.manifest.parent_version) {
    return Bad(source, "manifest: a delta must name its parent_version");
  }
  const absl::Span<const uint8_t> data = bytes.subspan(kPrefixBytes + header_len);
  auto tensors = j.find("tensors");
  if (tensors == j.end() || !tensors->is_array() || tensors->size() > out.manifest.tensors.size()) {
    return Bad(source, "tensors: must be a list of at most one entry per tensor of the manifest");
  }
  std::set<std::string> seen;
  uint64_t expect_begin = 0;
  for (size_t i = 0; i < tensors->size(); ++i) {
    const Json& t = (*tensors)[i];
    const std::string field = absl::StrCat("tensors[", i, "]");
    if (!t.is_object()) return Bad(source, field + ": not an object");
    auto name = t.find("name");
    if (name == t.end() || !name->is_string()) return Bad(source, field + ".name: missing");
    DeltaTensor d;
    d.name = name->get<std::string>();
    auto entry = out.manifest.tensors.find(d.name);
    if (entry == out.manifest.tensors.end()) {
      return Bad(source, absl::StrCat(field, ": tensor '", d.name.substr(0, 128),
                                      "' is not in the manifest"));
    }
    if (!seen.insert(d.name).second) {
      return Bad(source, absl::StrCat(field, ": tensor '", d.name, "' is listed twice"));
    }
    auto dtype = t.find("dtype");
    if (dtype == t.end() || !dtype->is_string() ||
        *dtype != model_io::DTypeName(entry->second.dtype)) {
      return Bad(source, absl::StrCat(field, ".dtype: must be the manifest's ",
                                      model_io::DTypeName(entry->second.dtype)));
    }
    d.dtype = entry->second.dtype;
    auto encoding = t.find("encoding");
    std::optional<DeltaEncoding> enc;
    if (encoding != t.end() && encoding->is_string()) {
      enc = ParseDeltaEncoding(encoding->get_ref<const std::string&>());
    }
    if (!enc) return Bad(source, field + ".encoding: must be \"overwrite\" or \"xor\"");
    d.delta.encoding = *enc;
    const int64_t numel = *model_io::CheckedNumElements(entry->second.shape);  // checked at parse
    auto count = t.find("count");
    if (count == t.end() || !count->is_number_integer() || count->get<int64_t>() < 0 ||
        count->get<int64_t>() > numel) {
      return Bad(source, absl::StrCat(field, ".count: must be in [0, ", numel, "]"));
    }
    d.delta.count = count->get<int64_t>();
    auto offsets = t.find("data_offsets");
    if (offsets == t.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return Bad(source, field + ".data_offsets: must be [begin, end]");
    }
    const uint64_t begin = (*offsets)[0].get<uint64_t>();
    const uint64_t end = (*offsets)[1].get<uint64_t>();
    if (begin != expect_begin || end < begin || end > data.size()) {
      return Bad(source, absl::StrCat(field, ".data_offsets [", begin, ", ", end,
                                      "] must start where the previous ends (", expect_begin,
                                      ") and lie in the data region of ", data.size(),
                                      " bytes (a cut file ends early)"));
    }
    d.delta.payload = data.subspan(begin, end - begin);
    expect_begin = end;
    out.tensors.push_back(std::move(d));
  }
  if (expect_begin != data.size()) {
    return Bad(source, absl::StrCat("data region of ", data.size(), " bytes but the tensors cover ",
                                    expect_begin));
  }
  out.num_bytes = static_cast<int64_t>(bytes.size());
  return out;
}

absl::StatusOr<DeltaFile> ReadDeltaFile(const std::string& path, int64_t max_bytes) {
  ASSIGN_OR_RETURN(std::shared_ptr<model_io::OwnedFile> file,
                   model_io::OwnedFile::Read(path, max_bytes));
  ASSIGN_OR_RETURN(DeltaFile out, ParseDeltaFile(file->bytes(), path));
  out.file = std::move(file);
  return out;
}

absl::Status WriteDeltaFile(const std::string& path, const Manifest& manifest,
                            const std::vector<NamedDelta>& tensors) {
  if (!manifest.parent_version) {
    return absl::InvalidArgumentError("delta file: the manifest must name its parent_version");
  }
  Json list = Json::array();
  uint64_t offset = 0;
  for (const NamedDelta& t : tensors) {
    list.push_back({{"name", t.name},
                    {"dtype", model_io::DTypeName(t.dtype)},
                    {"encoding", DeltaEncodingName(t.delta.encoding)},
                    {"count", t.delta.count},
                    {"data_offsets", {offset, offset + t.delta.payload.size()}}});
    offset += t.delta.payload.size();
  }
  const Json header = {{"format", kDeltaFormat},
                       {"manifest", Json::parse(ManifestToJson(manifest))},
                       {"tensors", std::move(list)}};
  const std::string text = header.dump();
  uint8_t prefix[kPrefixBytes];
  std::memcpy(prefix, kMagic, 8);
  for (int i = 0; i < 8; ++i) prefix[8 + i] = static_cast<uint8_t>(text.size() >> (8 * i));
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  bool ok = std::fwrite(prefix, 1, kPrefixBytes, f) == kPrefixBytes &&
            std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (size_t i = 0; ok && i < tensors.size(); ++i) {
    const auto& p = tensors[i].delta.payload;
    ok = p.empty() || std::fwrite(p.data(), 1, p.size(), f) == p.size();
  }
  const int write_errno = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(write_errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<DeltaPublicationStats> WriteDeltaPublication(const std::string& parent_dir,
                                                            const std::string& child_dir,
                                                            const std::string& out_dir,
                                                            int64_t version,
                                                            std::optional<int64_t> parent_version) {
  ASSIGN_OR_RETURN(model_io::Checkpoint parent, model_io::OpenCheckpoint(parent_dir));
  ASSIGN_OR_RETURN(model_io::Checkpoint child, model_io::OpenCheckpoint(child_dir));
  ASSIGN_OR_RETURN(std::optional<Manifest> parent_manifest, ReadManifest(parent_dir));
  std::string parent_sha;
  if (parent_manifest) {
    if (parent_version && *parent_version != parent_manifest->version) {
      return absl::InvalidArgumentError(absl::StrCat("parent_version: ", *parent_version, ", but ",
                                                     parent_dir, "/", kManifestFileName,
                                                     " says version ", parent_manifest->version));
    }
    parent_version = parent_manifest->version;
    parent_sha = parent_manifest->sha256;
  } else if (!parent_version) {
    return absl::InvalidArgumentError(absl::StrCat("parent_version: ", parent_dir, " has no ",
                                                   kManifestFileName, "; name its version"));
  } else {
    parent_sha = ManifestOfCheckpoint(parent, *parent_version).sha256;
  }
  if (version <= *parent_version) {
    return absl::InvalidArgumentError(
        absl::StrCat("version: ", version, " must be greater than the parent's ", *parent_version));
  }
  DeltaPublicationStats stats;
  std::vector<NamedDelta> deltas;
  for (const auto& [name, c] : child.tensors()) {
    if (!model_io::IsFloatWeightDType(c.dtype)) continue;  // never served
    const model_io::TensorView* p = parent.Find(name);
    if (p == nullptr || p->dtype != c.dtype || p->shape != c.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' of ", child_dir,
                       " has no counterpart of the same dtype and shape in ", parent_dir,
                       " (a delta changes values, not layouts)"));
    }
    ASSIGN_OR_RETURN(const int width, DeltaWordBytes(c.dtype));
    stats.dense_bytes += static_cast<int64_t>(c.data.size());
    stats.num_elements += static_cast<int64_t>(c.data.size()) / width;
    ASSIGN_OR_RETURN(TensorDelta d, EncodeDelta(c.dtype, p->data, c.data));
    if (d.count == 0) continue;
    ASSIGN_OR_RETURN(const int64_t changed, CountChangedWords(c.dtype, p->data, c.data));
    stats.changed_elements += changed;
    (d.encoding == DeltaEncoding::kOverwrite ? stats.num_overwrite : stats.num_xor) += 1;
    deltas.push_back({name, c.dtype, std::move(d)});
  }
  const Manifest manifest = ManifestOfCheckpoint(child, version, parent_version, parent_sha);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  const std::string path = (std::filesystem::path(out_dir) / kDeltaFileName).string();
  RETURN_IF_ERROR(WriteDeltaFile(path, manifest, deltas));
  RETURN_IF_ERROR(WriteManifest(out_dir, manifest));
  stats.delta_bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  return stats;
}

}  // namespace rl::weight_sync
