#include "common/model_io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace rl::model_io {

namespace {

using Json = nlohmann::json;

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors ", source, ": ", what));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::atomic<bool> non_finite_allowed{false};
thread_local int scoped_non_finite_allowed = 0;

// Finds the first non-finite element of a file's float tensors while its pieces are read (see
// the header). Visit() runs on the reading threads; the earliest bad byte offset wins, so the
// answer does not depend on which thread got there first.
class NonFiniteScan {
 public:
  NonFiniteScan(const std::vector<TensorView>& views, const uint8_t* base) : base_(base) {
    for (size_t i = 0; i < views.size(); ++i) {
      const TensorView& v = views[i];
      if (!IsFloatWeightDType(v.dtype) || v.data.empty()) continue;
      const size_t begin = static_cast<size_t>(v.data.data() - base);
      const size_t element = static_cast<size_t>(DTypeSize(v.dtype));
      (begin % element == 0 ? aligned_ : misaligned_).push_back({begin, begin + v.data.size(), i});
    }
    std::sort(aligned_.begin(), aligned_.end(),
              [](const Range& a, const Range& b) { return a.begin < b.begin; });
  }

  // Elements that lie wholly in the piece (aligned tensors: an element never straddles a piece
  // boundary, which is a multiple of every element size).
  void Visit(const std::vector<TensorView>& views, size_t offset, size_t size) {
    const size_t end = offset + size;
    if (offset >= first_bad_.load(std::memory_order_relaxed)) return;
    auto it = std::upper_bound(aligned_.begin(), aligned_.end(), offset,
                               [](size_t o, const Range& r) { return o < r.begin; });
    if (it != aligned_.begin()) --it;
    for (; it != aligned_.end() && it->begin < end; ++it) {
      const size_t from = std::max(offset, it->begin);
      const size_t to = std::min(end, it->end);
      if (from >= to) continue;
      Scan(views[it->view].dtype, from, to);
    }
  }

  // Misaligned tensors, whole (their elements may straddle pieces).
  void Finish(const std::vector<TensorView>& views) {
    for (const Range& r : misaligned_) Scan(views[r.view].dtype, r.begin, r.end);
  }

  // InvalidArgument naming the first non-finite element, if any.
  absl::Status Result(const std::vector<TensorView>& views, const std::string& source) const {
    const size_t bad = first_bad_.load();
    if (bad == kNone) return absl::OkStatus();
    for (const TensorView& v : views) {
      const size_t begin = static_cast<size_t>(v.data.data() - base_);
      if (bad < begin || bad >= begin + v.data.size()) continue;
      const int64_t index = static_cast<int64_t>(bad - begin) / DTypeSize(v.dtype);
      std::vector<int64_t> at(v.shape.size());
      int64_t rest = index;
      for (size_t d = v.shape.size(); d-- > 0;) {
        at[d] = rest % v.shape[d];
        rest /= v.shape[d];
      }
      return Invalid(source, absl::StrCat("tensor '", v.name, "' (", DTypeName(v.dtype), " ",
                                          ShapeString(v.shape), ") holds ",
                                          NonFiniteName(v.dtype, base_ + bad), " at element ",
                                          index, " (index ", ShapeString(at),
                                          "): non-finite weights are refused (rl-worker "
                                          "--allow-non-finite-weights loads them)"));
    }
    return absl::InternalError("non-finite scan: offset outside every tensor");
  }

 private:
  static constexpr size_t kNone = ~size_t{0};
  struct Range {
    size_t begin, end, view;
  };

  // Scans bytes [from, to) of one tensor (element-aligned) and records the first bad offset.
  void Scan(DType dtype, size_t from, size_t to) {
    const size_t element = static_cast<size_t>(DTypeSize(dtype));
    const int64_t found =
        FindNonFinite(dtype, base_ + from, static_cast<int64_t>((to - from) / element));
    if (found < 0) return;
    const size_t at = from + static_cast<size_t>(found) * element;
    size_t seen = first_bad_.load(std::memory_order_relaxed);
    while (at < seen && !first_bad_.compare_exchange_weak(seen, at)) {
    }
  }

  const uint8_t* base_;
  std::vector<Range> aligned_;  // sorted by begin
  std::vector<Range> misaligned_;
  std::atomic<size_t> first_bad_{kNone};
};

}  // namespace

void SetNonFiniteWeightsAllowed(bool allowed) { non_finite_allowed.store(allowed); }

bool NonFiniteWeightsAllowed() {
  return scoped_non_finite_allowed > 0 || non_finite_allowed.load();
}

ScopedNonFiniteWeightsAllowed::ScopedNonFiniteWeightsAllowed() { ++scoped_non_finite_allowed; }
ScopedNonFiniteWeightsAllowed::~ScopedNonFiniteWeightsAllowed() { --scoped_non_finite_allowed; }

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::vector<TensorView>> ParseSafetensors(absl::Span<const uint8_t> bytes,
                                                         const std::string& source) {
  if (bytes.size() < 8) {
    return Invalid(source, absl::StrCat("truncated: ", bytes.size(),
                                        " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | bytes[i];
  const uint64_t available = bytes.size() - 8;
  if (header_len > available) {
    return Invalid(
        source, absl::StrCat("header length ", header_len, " is larger than the rest of the file (",
                             available, " bytes): truncated or corrupt"));
  }
  if (header_len < 2) return Invalid(source, "header length too small for a JSON object");
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return Invalid(source, absl::StrCat("header length ", header_len, " is over the limit of ",
                                        kMaxSafetensorsHeaderBytes, " bytes"));
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  RETURN_IF_ERROR(CheckJsonDepth(absl::string_view(header_begin, header_len), kMaxJsonDepth,
                                 absl::StrCat("safetensors ", source, " header")));
  Json header = Json::parse(header_begin, header_begin + header_len, nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded()) return Invalid(source, "header is not valid JSON");
  if (!header.is_object()) return Invalid(source, "header is not a JSON object");

  const uint8_t* data_begin = bytes.data() + 8 + header_len;
  const uint64_t data_size = available - header_len;

  std::vector<TensorView> views;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // (begin, end) per view
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it.value().is_object()) return Invalid(source, "__metadata__ is not an object");
      continue;
    }
    const Json& entry = it.value();
    const std::string where = absl::StrCat("tensor '", name, "'");
    if (!entry.is_object()) return Invalid(source, where + " entry is not an object");
    auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) {
      return Invalid(source, where + ": missing or non-string dtype");
    }
    std::optional<DType> dtype = ParseDType(dt->get<std::string>());
    if (!dtype) {
      return Invalid(source, absl::StrCat(where, ": unknown dtype '", dt->get<std::string>(), "'"));
    }
    auto sh = entry.find("shape");
    if (sh == entry.end() || !sh->is_array()) {
      return Invalid(source, where + ": missing or non-array shape");
    }
    std::vector<int64_t> shape;
    for (const Json& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return Invalid(source, where + ": shape entries must be non-negative integers");
      }
      shape.push_back(d.get<int64_t>());
    }
    auto off = entry.find("data_offsets");
    if (off == entry.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      return Invalid(source, where + ": data_offsets must be two non-negative integers");
    }
    const uint64_t begin = (*off)[0].get<uint64_t>();
    const uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end) {
      return Invalid(source,
                     absl::StrCat(where, ": data_offsets [", begin, ", ", end, "] are reversed"));
    }
    if (end > data_size) {
      return Invalid(source,
                     absl::StrCat(where, ": data_offsets [", begin, ", ", end,
                                  "] out of range of the ", data_size, "-byte data region"));
    }
    const absl::StatusOr<int64_t> numel = CheckedNumElements(shape);
    if (!numel.ok()) {
      return Invalid(source, absl::StrCat(where, ": shape ", ShapeString(shape), " overflows"));
    }
    // Bounded by division first: count x dtype size can wrap a uint64 (2^61 x 8 bytes).
    const uint64_t dtype_size = static_cast<uint64_t>(DTypeSize(*dtype));
    if (static_cast<uint64_t>(*numel) > std::numeric_limits<uint64_t>::max() / dtype_size) {
      return Invalid(source, absl::StrCat(where, ": shape ", ShapeString(shape), " x ",
                                          DTypeName(*dtype), " overflows a 64-bit byte size"));
    }
    const uint64_t expected = static_cast<uint64_t>(*numel) * dtype_size;
    if (expected != end - begin) {
      return Invalid(
          source, absl::StrCat(where, ": shape ", ShapeString(shape), " x ", DTypeName(*dtype),
                               " needs ", expected, " bytes but data_offsets span ", end - begin));
    }
    TensorView v;
    v.name = name;
    v.dtype = *dtype;
    v.shape = std::move(shape);
    v.data = absl::Span<const uint8_t>(data_begin + begin, end - begin);
    views.push_back(std::move(v));
    ranges.emplace_back(begin, end);
  }

  // The ranges must tile [0, data_size) in some order: no overlap, no hole.
  std::vector<size_t> order(views.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  uint64_t cursor = 0;
  for (size_t i : order) {
    if (ranges[i].first < cursor) {
      return Invalid(source, absl::StrCat("tensor '", views[i].name, "' data_offsets [",
                                          ranges[i].first, ", ", ranges[i].second,
                                          "] overlap the previous tensor (ends at ", cursor, ")"));
    }
    if (ranges[i].first > cursor) {
      return Invalid(
          source, absl::StrCat("tensor '", views[i].name, "' data_offsets [", ranges[i].first, ", ",
                               ranges[i].second, "] leave a hole after byte ", cursor,
                               " (offsets must be contiguous)"));
    }
    cursor = ranges[i].second;
  }
  if (cursor != data_size) {
    return Invalid(
        source, absl::StrCat("data region is ", data_size, " bytes but the tensors cover ", cursor,
                             " (trailing bytes or truncated header)"));
  }
  return views;
}

const TensorView* Checkpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path());
  return out;
}

std::vector<size_t> Checkpoint::file_sizes() const {
  std::vector<size_t> out;
  for (const auto& f : files_) out.push_back(f->bytes().size());
  return out;
}

absl::Status Checkpoint::AddFile(const std::string& path, const std::vector<std::string>* only) {
  // The header first (8-byte length, then the JSON), so the tensors' bytes can be checked for
  // non-finite values as they are read. ParseSafetensors only reads the header's bytes (after
  // checking the length), so it may run before the data region is read.
  ASSIGN_OR_RETURN(OwnedFileReader reader, OwnedFileReader::Open(path, kMaxShardBytes));
  RETURN_IF_ERROR(reader.ReadPrefix(8));
  if (reader.size() >= 8) {
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = header_len << 8 | reader.bytes()[i];
    if (header_len <= std::min<uint64_t>(reader.size() - 8, kMaxSafetensorsHeaderBytes)) {
      RETURN_IF_ERROR(reader.ReadPrefix(8 + static_cast<size_t>(header_len)));
    }
  }
  ASSIGN_OR_RETURN(std::vector<TensorView> views, ParseSafetensors(reader.bytes(), path));
  std::optional<NonFiniteScan> scan;
  PieceVisitor visit;
  if (!NonFiniteWeightsAllowed()) {
    scan.emplace(views, reader.bytes().data());
    visit = [&](size_t offset, absl::Span<const uint8_t> piece) {
      scan->Visit(views, offset, piece.size());
    };
  }
  ASSIGN_OR_RETURN(std::shared_ptr<OwnedFile> file, reader.ReadRest(visit));
  if (scan) {
    scan->Finish(views);
    RETURN_IF_ERROR(scan->Result(views, path));
  }
  std::set<std::string> wanted;
  if (only != nullptr) wanted.insert(only->begin(), only->end());
  for (TensorView& v : views) {
    if (only != nullptr && !wanted.contains(v.name)) continue;
    wanted.erase(v.name);
    if (tensors_.contains(v.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint: tensor '", v.name, "' appears in more than one file (", path, ")"));
    }
    std::string name = v.name;
    tensors_.emplace(std::move(name), std::move(v));
  }
  if (only != nullptr && !wanted.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: tensor '", *wanted.begin(),
                                                   "' is listed in the index for ", path,
                                                   " but not stored there"));
  }
  files_.push_back(std::move(file));
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> OpenSafetensorsFile(const std::string& path) {
  Checkpoint ckpt;
  RETURN_IF_ERROR(ckpt.AddFile(path, nullptr));
  return ckpt;
}

absl::StatusOr<Checkpoint> OpenCheckpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory not found: ", dir));
  }
  Checkpoint ckpt;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(index_path.string()));
    RETURN_IF_ERROR(CheckJsonDepth(text, kMaxJsonDepth, index_path.string()));
    Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": not a JSON object"));
    }
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": missing object field 'weight_map'"));
    }
    std::map<std::string, std::vector<std::string>> by_file;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path.string(), ": weight_map['", it.key(), "'] is not a file name"));
      }
      const std::string file = it.value().get<std::string>();
      if (file.find('/') != std::string::npos || file.empty() || file[0] == '.') {
        return absl::InvalidArgumentError(absl::StrCat(
            index_path.string(), ": weight_map['", it.key(), "'] names a bad file '", file, "'"));
      }
      by_file[file].push_back(it.key());
    }
    for (const auto& [file, names] : by_file) {
      RETURN_IF_ERROR(ckpt.AddFile((fs::path(dir) / file).string(), &names));
    }
    return ckpt;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(single, ec)) {
    RETURN_IF_ERROR(ckpt.AddFile(single.string(), nullptr));
    return ckpt;
  }
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
  }
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat("no .safetensors files in ", dir));
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) RETURN_IF_ERROR(ckpt.AddFile(f, nullptr));
  return ckpt;
}

absl::Status WriteSafetensorsStreaming(const std::string& path,
                                       const std::vector<TensorToWrite>& specs,
                                       const TensorFill& fill,
                                       const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto& t : specs) {
    const absl::StatusOr<int64_t> numel = CheckedNumElements(t.shape);
    if (!numel.ok() || DTypeSize(t.dtype) == 0 ||
        *numel > (int64_t{1} << 62) / DTypeSize(t.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteSafetensors: tensor '", t.name, "' has a bad shape or dtype"));
    }
    if (header.contains(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteSafetensors: duplicate tensor '", t.name, "'"));
    }
    const uint64_t size = static_cast<uint64_t>(*numel) * DTypeSize(t.dtype);
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + size}}};
    offset += size;
    sizes.push_back(size);
  }
  std::string text = header.dump();
  // Pad the header with spaces so the data region is 8-byte aligned (as the reference writer).
  while (text.size() % 8 != 0) text.push_back(' ');
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  uint8_t len[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(text.data(), 1, n, f) == n;
  absl::Status fill_status;
  std::vector<uint8_t> buffer;
  for (size_t i = 0; ok && i < specs.size(); ++i) {
    buffer.resize(sizes[i]);
    fill_status = fill(i, absl::MakeSpan(buffer));
    ok = fill_status.ok() &&
         (buffer.empty() || std::fwrite(buffer.data(), 1, buffer.size(), f) == buffer.size());
  }
  const int write_errno = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    if (!fill_status.ok()) return fill_status;
    return absl::InternalError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(write_errno)));
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckSizes(const std::vector<TensorToWrite>& tensors) {
  for (const auto& t : tensors) {
    const absl::StatusOr<int64_t> numel = CheckedNumElements(t.shape);
    if (!numel.ok() || static_cast<uint64_t>(*numel) > t.data.size() ||
        static_cast<uint64_t>(*numel) * DTypeSize(t.dtype) != t.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WriteSafetensors: tensor '", t.name, "' has ", t.data.size(), " bytes but shape ",
          ShapeString(t.shape), " x ", DTypeName(t.dtype), " needs another size"));
    }
  }
  return absl::OkStatus();
}

TensorFill CopyFrom(const std::vector<TensorToWrite>& tensors) {
  return [&tensors](size_t i, absl::Span<uint8_t> out) {
    if (!out.empty()) std::memcpy(out.data(), tensors[i].data.data(), out.size());
    return absl::OkStatus();
  };
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  RETURN_IF_ERROR(CheckSizes(tensors));
  return WriteSafetensorsStreaming(path, tensors, CopyFrom(tensors), metadata);
}

absl::Status WriteCheckpoint(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                             int64_t max_shard_bytes) {
  RETURN_IF_ERROR(CheckSizes(tensors));
  return WriteCheckpoint(dir, tensors, CopyFrom(tensors), max_shard_bytes);
}

absl::Status WriteCheckpoint(const std::string& dir, const std::vector<TensorToWrite>& specs,
                             const TensorFill& fill, int64_t max_shard_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const auto& t : specs) {
    const absl::StatusOr<int64_t> numel = CheckedNumElements(t.shape);
    if (!numel.ok() || *numel > (int64_t{1} << 62) / DTypeSize(t.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("WriteCheckpoint: bad shape of ", t.name));
    }
    sizes.push_back(*numel * DTypeSize(t.dtype));
    total += sizes.back();
  }
  if (max_shard_bytes <= 0 || total <= max_shard_bytes) {
    return WriteSafetensorsStreaming((fs::path(dir) / "model.safetensors").string(), specs, fill);
  }
  std::vector<std::vector<size_t>> shards(1);
  int64_t current = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (current > 0 && current + sizes[i] > max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += sizes[i];
  }
  Json weight_map = Json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name =
        absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    std::vector<TensorToWrite> shard_specs;
    for (size_t i : shards[s]) shard_specs.push_back(specs[i]);
    const std::vector<size_t>& ids = shards[s];
    RETURN_IF_ERROR(WriteSafetensorsStreaming(
        (fs::path(dir) / name).string(), shard_specs,
        [&](size_t j, absl::Span<uint8_t> out) { return fill(ids[j], out); }));
    for (size_t i : shards[s]) weight_map[specs[i].name] = name;
  }
  Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream out(fs::path(dir) / "model.safetensors.index.json");
  out << index.dump(2) << "\n";
  if (!out) return absl::InternalError(absl::StrCat("cannot write index in ", dir));
  return absl::OkStatus();
}

}  // namespace rl::model_io
