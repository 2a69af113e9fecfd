#include "common/weight_sync/bucket_plan.h"

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

std::string BucketJson(const Bucket& bucket, size_t index, size_t num_buckets) {
  nlohmann::json names = nlohmann::json::array();
  nlohmann::json dtypes = nlohmann::json::array();
  nlohmann::json shapes = nlohmann::json::array();
  for (const TensorSpec& spec : bucket.specs) {
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
  return line.dump();
}

absl::StatusOr<std::vector<TensorSpec>> ParseBucketJson(const std::string& line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("names") || !j.contains("dtypes") || !j.contains("shapes") ||
      !j["names"].is_array() || !j["dtypes"].is_array() || !j["shapes"].is_array() ||
      j["names"].size() != j["dtypes"].size() || j["names"].size() != j["shapes"].size()) {
    return absl::InvalidArgumentError(absl::StrCat("not a bucket line: ", line.substr(0, 200)));
  }
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < j["names"].size(); ++i) {
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
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace rl::weight_sync
