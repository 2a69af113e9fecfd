// rlctl push: a checkpoint folder or a delta publication pushed as an UpdateWeightsFromTensor
// stream (issue 30). A folder holding weights.rldelta is sent as a delta stream (parent_version
// and manifest_json from its manifest; every tensor's payload as chunks with its encoding and
// count); any other folder as a dense stream of its float tensors, with its rl-manifest.json
// when it has one (the workers verify the result against it). --stage stages instead of applying
// (then activate-weights). Memory: the checkpoint or delta file is mapped or read once; one chunk
// is in flight at a time.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model_io/dtype.h"
#include "common/model_io/safetensors.h"
#include "common/weight_sync/delta_file.h"
#include "common/weight_sync/manifest.h"
#include "tools/rlctl/commands.h"

namespace rl::rlctl {
namespace {

constexpr int64_t kPushChunkBytes = int64_t{4} << 20;
constexpr int64_t kMaxDeltaFileBytes = int64_t{64} << 30;

// Writes the stream: `first` carries the options; each chunk of `data` (at most
// kPushChunkBytes, a multiple of `align`) a message; then the end alone.
class StreamWriter {
 public:
  StreamWriter(grpc::ClientWriter<rl::v1::UpdateWeightsFromTensorRequest>* writer,
               rl::v1::UpdateWeightsFromTensorRequest first)
      : writer_(writer), next_(std::move(first)) {}

  bool Send(rl::v1::TensorChunk header, absl::Span<const uint8_t> data, int64_t align) {
    const int64_t step = std::max<int64_t>(kPushChunkBytes / align * align, align);
    uint64_t offset = 0;
    do {
      const size_t n = std::min<size_t>(data.size() - offset, static_cast<size_t>(step));
      *next_.mutable_chunk() = header;
      next_.mutable_chunk()->set_offset(offset);
      next_.mutable_chunk()->set_data(reinterpret_cast<const char*>(data.data()) + offset, n);
      if (!writer_->Write(next_)) return false;
      next_.Clear();
      offset += n;
      bytes_ += static_cast<int64_t>(n);
    } while (offset < data.size());
    names_.insert(header.name());
    return true;
  }
  bool End() {
    next_.mutable_end()->set_num_tensors(static_cast<int64_t>(names_.size()));
    next_.mutable_end()->set_num_bytes(bytes_);
    return writer_->Write(next_);
  }

 private:
  grpc::ClientWriter<rl::v1::UpdateWeightsFromTensorRequest>* writer_;
  rl::v1::UpdateWeightsFromTensorRequest next_;
  std::set<std::string> names_;
  int64_t bytes_ = 0;
};

rl::v1::TensorChunk Header(const std::string& name, model_io::DType dtype,
                           const std::vector<int64_t>& shape) {
  rl::v1::TensorChunk c;
  c.set_name(name);
  c.set_dtype(model_io::DTypeName(dtype));
  for (int64_t d : shape) c.add_shape(d);
  return c;
}

}  // namespace

int Push(const Options& o, const Client& c) {
  if (o.from_disk.empty()) {
    return Fail(o, Usage("push --from-disk DIR [--stage] [--version N]"));
  }
  const std::string delta_path =
      (std::filesystem::path(o.from_disk) / weight_sync::kDeltaFileName).string();
  std::error_code ec;
  const bool is_delta = std::filesystem::is_regular_file(delta_path, ec);
  rl::v1::UpdateWeightsFromTensorRequest first;
  first.set_stage(o.stage);
  if (o.version >= 0) first.set_weight_version(o.version);
  std::optional<weight_sync::DeltaFile> delta;
  std::optional<model_io::Checkpoint> ckpt;
  if (is_delta) {
    absl::StatusOr<weight_sync::DeltaFile> read =
        weight_sync::ReadDeltaFile(delta_path, kMaxDeltaFileBytes);
    if (!read.ok()) return Fail(o, read.status());
    delta = *std::move(read);
    if (o.version >= 0 && o.version != delta->manifest.version) {
      return Fail(o, absl::InvalidArgumentError(absl::StrCat("--version ", o.version, ", but ",
                                                             delta_path, " publishes version ",
                                                             delta->manifest.version)));
    }
    first.set_weight_version(delta->manifest.version);
    first.set_parent_version(*delta->manifest.parent_version);
    first.set_manifest_json(weight_sync::ManifestToJson(delta->manifest));
  } else {
    absl::StatusOr<model_io::Checkpoint> opened = model_io::OpenCheckpoint(o.from_disk);
    if (!opened.ok()) return Fail(o, opened.status());
    ckpt = *std::move(opened);
    absl::StatusOr<std::optional<weight_sync::Manifest>> m = weight_sync::ReadManifest(o.from_disk);
    if (!m.ok()) return Fail(o, m.status());
    if (m->has_value()) {
      if (o.version >= 0 && o.version != (*m)->version) {
        return Fail(o, absl::InvalidArgumentError(absl::StrCat("--version ", o.version, ", but ",
                                                               o.from_disk, " publishes version ",
                                                               (*m)->version)));
      }
      first.set_weight_version((*m)->version);
      first.set_manifest_json(weight_sync::ManifestToJson(**m));
    }
  }
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  rl::v1::AdminResponse resp;
  auto writer = c.admin()->UpdateWeightsFromTensor(&ctx, &resp);
  StreamWriter out(writer.get(), std::move(first));
  bool ok = true;
  if (delta) {
    for (const weight_sync::DeltaTensor& t : delta->tensors) {
      rl::v1::TensorChunk h = Header(t.name, t.dtype, delta->manifest.tensors.at(t.name).shape);
      h.set_encoding(weight_sync::DeltaEncodingName(t.delta.encoding));
      h.set_delta_count(t.delta.count);
      h.set_payload_bytes(static_cast<int64_t>(t.delta.payload.size()));
      if (!(ok = out.Send(h, t.delta.payload, 1))) break;
    }
  } else {
    for (const auto& [name, t] : ckpt->tensors()) {
      if (!model_io::IsFloatWeightDType(t.dtype)) continue;  // never served
      if (!(ok = out.Send(Header(name, t.dtype, t.shape), t.data, model_io::DTypeSize(t.dtype)))) {
        break;
      }
    }
  }
  if (ok) out.End();
  writer->WritesDone();
  return PrintAdminResponse(o, writer->Finish(), resp);
}

}  // namespace rl::rlctl
