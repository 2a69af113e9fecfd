#include "common/weight_sync/bucket_plan.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace rl::weight_sync {

absl::StatusOr<std::vector<Bucket>> PlanBuckets(const std::vector<model_io::TensorView>& tensors,
                                                int64_t bucket_bytes) {
  if (bucket_bytes <= 0) return absl::InvalidArgumentError("bucket_bytes: must be > 0");
  std::vector<Bucket> buckets;
  Bucket current;
  for (const model_io::TensorView& t : tensors) {
    TensorSpec spec{t.name, model_io::DTypeName(t.dtype), t.shape};
    ASSIGN_OR_RETURN(int64_t bytes, TensorBytes(spec));
    if (bytes != static_cast<int64_t>(t.data.size())) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' has ", t.data.size(),
                                                     " bytes, its shape needs ", bytes));
    }
    if (!current.specs.empty() && current.bytes + bytes > bucket_bytes) {
      buckets.push_back(std::move(current));
      current = Bucket();
    }
    current.specs.push_back(std::move(spec));
    current.data.push_back(t.data);
    current.bytes += bytes;
  }
  if (!current.specs.empty()) buckets.push_back(std::move(current));
  return buckets;
}

absl::StatusOr<std::vector<Bucket>> PlanBuckets(const model_io::Checkpoint& checkpoint,
                                                int64_t bucket_bytes) {
  std::vector<model_io::TensorView> tensors;
  tensors.reserve(checkpoint.tensors().size());
  for (const auto& [name, view] : checkpoint.tensors()) tensors.push_back(view);
  return PlanBuckets(tensors, bucket_bytes);
}

std::string BucketJson(const Bucket& bucket, size_t index, size_t num_buckets,
                       int64_t parent_version) {
  nlohmann::json names = nlohmann::json::array();
  nlohmann::json dtypes = nlohmann::json::array();
  nlohmann::json shapes = nlohmann::json::array();
  const bool delta = !bucket.listed.empty();
  for (const TensorSpec& spec : delta ? bucket.listed : bucket.specs) {
    names.push_back(spec.name);
    dtypes.push_back(spec.dtype);
    shapes.push_back(spec.shape);
  }
  nlohmann::json line = {{"bucket", index},
                         {"num_buckets", num_buckets},
                         {"bytes", bucket.bytes},
                         {"last", index + 1 == num_buckets},
                         {"names", std::move(names)},
                         {"dtypes", std::move(dtypes)},
                         {"shapes", std::move(shapes)}};
  if (delta) {
    nlohmann::json payload_bytes = nlohmann::json::array();
    for (const absl::Span<const uint8_t>& d : bucket.data) payload_bytes.push_back(d.size());
    line["encodings"] = bucket.encodings;
    line["delta_counts"] = bucket.delta_counts;
    line["payload_bytes"] = std::move(payload_bytes);
    if (parent_version >= 0) line["parent_version"] = parent_version;
  }
  return line.dump();
}

absl::StatusOr<BucketLine> ParseBucketLine(const std::string& line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("names") || !j.contains("dtypes") || !j.contains("shapes") ||
      !j["names"].is_array() || !j["dtypes"].is_array() || !j["shapes"].is_array() ||
      j["names"].size() != j["dtypes"].size() || j["names"].size() != j["shapes"].size()) {
    return absl::InvalidArgumentError(absl::StrCat("not a bucket line: ", line.substr(0, 200)));
  }
  BucketLine out;
  const size_t n = j["names"].size();
  for (size_t i = 0; i < n; ++i) {
    const auto& name = j["names"][i];
    const auto& dtype = j["dtypes"][i];
    const auto& shape = j["shapes"][i];
    if (!name.is_string() || !dtype.is_string() || !shape.is_array()) {
      return absl::InvalidArgumentError(absl::StrCat("bucket line: bad entry ", i));
    }
    TensorSpec spec{name.get<std::string>(), dtype.get<std::string>(), {}};
    for (const auto& d : shape) {
      if (!d.is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat("bucket line: bad shape of entry ", i));
      }
      spec.shape.push_back(d.get<int64_t>());
    }
    out.specs.push_back(std::move(spec));
  }
  if (j.contains("encodings") || j.contains("delta_counts") || j.contains("payload_bytes")) {
    for (const char* key : {"encodings", "delta_counts", "payload_bytes"}) {
      if (!j.contains(key) || !j[key].is_array() || j[key].size() != n) {
        return absl::InvalidArgumentError(
            absl::StrCat("bucket line: \"", key, "\" must list one entry per name"));
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const auto& e = j["encodings"][i];
      const auto& count = j["delta_counts"][i];
      const auto& bytes = j["payload_bytes"][i];
      if (!e.is_string() || !count.is_number_integer() || !bytes.is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat("bucket line: bad encoding of entry ", i));
      }
      out.encodings.push_back(e.get<std::string>());
      out.delta_counts.push_back(count.get<int64_t>());
      out.payload_bytes.push_back(bytes.get<int64_t>());
    }
  }
  if (j.contains("parent_version")) {
    if (!j["parent_version"].is_number_integer() || j["parent_version"].get<int64_t>() < 0) {
      return absl::InvalidArgumentError("bucket line: parent_version must be an integer >= 0");
    }
    out.parent_version = j["parent_version"].get<int64_t>();
  }
  return out;
}

absl::StatusOr<std::vector<TensorSpec>> ParseBucketJson(const std::string& line) {
  ASSIGN_OR_RETURN(BucketLine parsed, ParseBucketLine(line));
  return std::move(parsed.specs);
}

}  // namespace rl::weight_sync
