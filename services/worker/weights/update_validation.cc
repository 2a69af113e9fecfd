#include "services/worker/weights/update_validation.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_io/dtype.h"
#include "common/model_io/file_read.h"
#include "common/status.h"
#include "common/weight_sync/delta.h"
#include "services/worker/model/weights.h"

namespace rl::worker {

absl::Status CheckDiskUpdate(const std::string& model_path, const model_io::ModelConfig& served,
                             const RequestLimits& limits) {
  if (model_path.empty()) return absl::InvalidArgumentError("model_path: must not be empty");
  RETURN_IF_ERROR(CheckPath("model_path", model_path, limits));
  struct stat st;
  if (::stat(model_path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_path: ", QuoteForError(model_path, 512), " is not a folder"));
  }
  const std::string config_path = (std::filesystem::path(model_path) / "config.json").string();
  absl::StatusOr<std::string> text = model_io::ReadSmallFile(config_path);
  if (!text.ok()) return Annotate(text.status(), "model_path: config.json");
  RETURN_IF_ERROR(model_io::CheckJsonDepth(*text, model_io::kMaxJsonDepth, config_path));
  absl::StatusOr<model_io::ModelConfig> config = model_io::ParseModelConfig(*text);
  if (!config.ok()) return Annotate(config.status(), config_path);
  if (config->architecture_name != served.architecture_name) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": architecture ", QuoteForError(config->architecture_name),
                     " but this worker serves ", served.architecture_name));
  }
  if (absl::Status s = model::CheckSameArchitecture(served, *config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_path, ": describes another model than the one served (vocab ", config->vocab_size,
        " vs ", served.vocab_size, ", hidden ", config->hidden_size, " vs ", served.hidden_size,
        ", layers ", config->num_hidden_layers, " vs ", served.num_hidden_layers, ", heads ",
        config->num_attention_heads, "/", config->num_key_value_heads, " vs ",
        served.num_attention_heads, "/", served.num_key_value_heads, ", intermediate ",
        config->intermediate_size, " vs ", served.intermediate_size, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckChunkForModel(const rl::v1::TensorChunk& chunk, const WeightShapes& shapes,
                                const RequestLimits& limits, int64_t* tensor_bytes) {
  RETURN_IF_ERROR(CheckTensorChunk(chunk, limits, tensor_bytes));
  auto it = shapes.find(chunk.name());
  if (it == shapes.end()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.name: ", QuoteForError(chunk.name(), 128),
                                                   " is not a weight of the "
                                                   "served model"));
  }
  if (!std::equal(chunk.shape().begin(), chunk.shape().end(), it->second.begin(),
                  it->second.end())) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.shape: tensor ", QuoteForError(chunk.name(), 128), " has shape [",
                     absl::StrJoin(it->second, ", "), "] in the served model"));
  }
  return absl::OkStatus();
}

absl::Status CheckEncodedTensor(const model::TensorInfo& tensor, const EncodedTensor& encoded,
                                const RequestLimits& limits) {
  const std::optional<model_io::DType> dtype = model_io::ParseDType(tensor.dtype);
  absl::StatusOr<int64_t> numel = model_io::CheckedNumElements(tensor.shape);
  if (!dtype || !model_io::IsFloatWeightDType(*dtype) || !numel.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", QuoteForError(tensor.name, 128),
                                                   ": dtype '", tensor.dtype,
                                                   "' or its shape cannot carry a delta"));
  }
  ASSIGN_OR_RETURN(const int width, weight_sync::DeltaWordBytes(*dtype));
  absl::StatusOr<int64_t> most =
      weight_sync::MaxDeltaPayloadBytes(encoded.encoding, encoded.count, *numel, width);
  if (!most.ok())
    return Annotate(most.status(), absl::StrCat("tensor ", QuoteForError(tensor.name, 128)));
  if (encoded.payload_bytes < 0 || encoded.payload_bytes > *most ||
      encoded.payload_bytes > limits.max_update_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", QuoteForError(tensor.name, 128), ": a ",
                     weight_sync::DeltaEncodingName(encoded.encoding), " payload of ",
                     encoded.payload_bytes, " bytes for ", encoded.count, " entries (at most ",
                     std::min(*most, limits.max_update_bytes), ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTensors(const std::vector<model::TensorInfo>& served,
                             const std::vector<const model::TensorInfo*>& incoming,
                             const std::vector<int64_t>& byte_counts) {
  std::map<std::string, const model::TensorInfo*> by_name;
  for (const auto& t : served) by_name[t.name] = &t;
  std::set<std::string> seen;
  for (size_t i = 0; i < incoming.size(); ++i) {
    const model::TensorInfo& t = *incoming[i];
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': no such weight"));
    }
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': sent twice"));
    }
    if (t.shape != it->second->shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': shape [", absl::StrJoin(t.shape, ", "),
                       "] but the model has [", absl::StrJoin(it->second->shape, ", "), "]"));
    }
    const std::optional<model_io::DType> dtype = model_io::ParseDType(t.dtype);
    if (!dtype || !model_io::IsFloatWeightDType(*dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': dtype '", t.dtype, "' (F32, BF16 or F16)"));
    }
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (byte_counts[i] >= 0 && byte_counts[i] != numel * model_io::DTypeSize(*dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", byte_counts[i],
                                                     " bytes, expected ",
                                                     numel * model_io::DTypeSize(*dtype)));
    }
  }
  return absl::OkStatus();
}

}  // namespace rl::worker
