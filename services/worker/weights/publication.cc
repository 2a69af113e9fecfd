#include "services/worker/weights/publication.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model_io/file_read.h"
#include "common/model_io/safetensors.h"
#include "common/request_limits.h"
#include "common/status.h"
#include "common/weight_sync/delta_file.h"
#include "services/worker/model/sleepable_runner.h"
#include "services/worker/weights/update_validation.h"

namespace rl::worker {
namespace {

using weight_sync::DeltaFile;
using weight_sync::Manifest;

std::string Short(const std::string& hex) { return hex.substr(0, 12) + "..."; }

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// DIR holds safetensors files (a checkpoint beside, or instead of, a delta).
bool HasCheckpoint(const std::string& dir) {
  std::error_code ec;
  int seen = 0;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator() && seen < 4096;
       it.increment(ec), ++seen) {
    if (it->path().extension() == ".safetensors") return true;
  }
  return false;
}

// What CopyServedWeights cost the engine thread.
struct CopyCost {
  int hops = 0;
  double engine_s = 0;  // wall time inside the hops, on the engine thread
  bool reused = false;  // the arena came from the spare pool
};

// A copy of every served tensor into one pooled arena (model_io::PooledBuffer), whose pages are
// faulted in here, on the caller's (staging) thread, before the first hop; then taken on the
// engine thread in slices of kCopySliceBytes, each hop a plain memcpy into memory that is
// already mapped, so the engine keeps stepping between them. ABORTED when the served version
// moved from `version` meanwhile (the copy would mix versions).
absl::StatusOr<std::vector<model::OwnedTensor>> CopyServedWeights(engine::Engine& engine,
                                                                  int64_t version, CopyCost* cost) {
  auto moved = [&]() {
    return absl::AbortedError(absl::StrCat("delta: the served weights changed from version ",
                                           version,
                                           " while they were copied; stage the delta again"));
  };
  std::vector<model::TensorInfo> infos;
  RETURN_IF_ERROR(engine.RunOnEngineThread([&](engine::EngineContext& ctx) -> absl::Status {
    if (engine.weight_version() != version) return moved();
    infos = ctx.runner().ListWeights();
    return absl::OkStatus();
  }));
  constexpr int64_t kAlign = 64;  // every tensor starts on a cache line
  std::vector<model::OwnedTensor> copy;
  std::map<std::string, size_t> index;
  int64_t total = 0;
  std::vector<int64_t> offsets;
  for (model::TensorInfo& info : infos) {
    const std::optional<model_io::DType> dtype = model_io::ParseDType(info.dtype);
    ASSIGN_OR_RETURN(const int64_t numel, model_io::CheckedNumElements(info.shape));
    if (!dtype) return absl::InternalError(absl::StrCat(info.name, ": dtype ", info.dtype));
    model::OwnedTensor t;
    t.num_bytes = numel * model_io::DTypeSize(*dtype);
    t.info = std::move(info);
    index[t.info.name] = copy.size();
    offsets.push_back(total);
    total += (t.num_bytes + kAlign - 1) / kAlign * kAlign;
    copy.push_back(std::move(t));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<model_io::PooledBuffer> arena,
                   model_io::PooledBuffer::Take(static_cast<size_t>(std::max<int64_t>(total, 1))));
  arena->Prefault();  // here, at the staging thread's priority: the hops below fault nothing
  cost->reused = arena->reused();
  const std::shared_ptr<const void> owner = arena;
  for (size_t i = 0; i < copy.size(); ++i) {
    copy[i].data = arena->data() + offsets[i];
    copy[i].owner = owner;
  }
  for (size_t begin = 0; begin < copy.size();) {
    size_t end = begin;
    int64_t bytes = 0;
    while (end < copy.size() && (end == begin || bytes + copy[end].num_bytes <= kCopySliceBytes)) {
      bytes += copy[end++].num_bytes;
    }
    absl::Status hop = engine.RunOnEngineThread([&](engine::EngineContext& ctx) -> absl::Status {
      const auto t0 = std::chrono::steady_clock::now();
      ++cost->hops;
      if (engine.weight_version() != version) return moved();
      absl::Status inner;
      RETURN_IF_ERROR(ctx.runner().VisitWeights(
          [&](const model::TensorInfo& info, absl::Span<const uint8_t> data) {
            auto it = index.find(info.name);
            if (it == index.end() || it->second < begin || it->second >= end) return;
            model::OwnedTensor& t = copy[it->second];
            if (static_cast<int64_t>(data.size()) != t.num_bytes) {
              inner = absl::AbortedError(
                  absl::StrCat("delta: tensor '", info.name, "' changed size while copied"));
              return;
            }
            std::memcpy(t.data, data.data(), data.size());
          }));
      cost->engine_s +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return inner;
    });
    if (!hop.ok()) {
      return Annotate(hop, "delta: copying the served weights (the parent) failed");
    }
    begin = end;
  }
  return copy;
}

// The manifest's digest of every tensor `weights` holds (verified against it before).
std::map<std::string, std::string> ServedDigests(const model::Weights& weights, const Manifest& m) {
  std::map<std::string, std::string> out;
  for (const model::TensorInfo& info : weights.List()) {
    auto it = m.tensors.find(info.name);
    if (it != m.tensors.end()) out[info.name] = it->second.sha256;
  }
  return out;
}

absl::Status CheckVersionArgument(std::optional<int64_t> requested, const Manifest& m,
                                  const std::string& dir) {
  if (requested.has_value() && *requested != m.version) {
    return absl::InvalidArgumentError(absl::StrCat("weight_version: ", *requested, ", but ", dir,
                                                   " publishes version ", m.version));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReadVersion> ReadDelta(const std::string& dir, const DeltaFile& delta,
                                      std::optional<int64_t> requested,
                                      const PublicationDeps& deps) {
  const Manifest& m = delta.manifest;
  RETURN_IF_ERROR(CheckVersionArgument(requested, m, dir));
  ASSIGN_OR_RETURN(std::optional<Manifest> beside, weight_sync::ReadManifest(dir));
  if (beside && (beside->sha256 != m.sha256 || beside->version != m.version)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": ", weight_sync::kManifestFileName, " (version ", beside->version, ", ",
                     Short(beside->sha256), ") is not the delta's manifest (version ", m.version,
                     ", ", Short(m.sha256), ")"));
  }
  ASSIGN_OR_RETURN(ReadVersion out,
                   StageDeltaOnServedCopy(absl::StrCat("delta ", dir), m, delta.tensors, deps));
  out.delta_bytes = delta.num_bytes;
  return out;
}

absl::StatusOr<ReadVersion> ReadDense(const std::string& dir, std::optional<int64_t> requested,
                                      const PublicationDeps& deps) {
  RETURN_IF_ERROR(CheckDiskUpdate(dir, deps.model_config, deps.limits));
  ASSIGN_OR_RETURN(std::optional<Manifest> m, weight_sync::ReadManifest(dir));
  if (m) {
    RETURN_IF_ERROR(CheckVersionArgument(requested, *m, dir));
    if (deps.ledger != nullptr) {
      RETURN_IF_ERROR(deps.ledger->CheckSameContent(m->version, m->sha256));
    }
  }
  ReadVersion out;
  // Taken before the read: a save racing with it shows up as a change on wake.
  out.identity = model::FolderIdentity(dir).value_or("");
  out.reload_path = dir;
  ASSIGN_OR_RETURN(out.weights, model::LoadWeights(dir, deps.model_config));
  out.version = requested;
  if (m) {
    RETURN_IF_ERROR(Annotate(VerifyWeights(*out.weights, *m), dir));
    out.version = m->version;
    out.manifest_sha256 = m->sha256;
    out.tensor_sha256 = ServedDigests(*out.weights, *m);
  }
  return out;
}

}  // namespace

absl::Status VersionLedger::CheckSameContent(int64_t version, const std::string& sha256) const {
  absl::MutexLock lock(&mu_);
  auto it = digests_.find(version);
  if (it == digests_.end() || it->second == sha256) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("version ", version, " was served here with content sha256 ", Short(it->second),
                   ", and this publication's is ", Short(sha256),
                   ": a version number never names two contents (publish it as a new version)"));
}

void VersionLedger::Record(int64_t version, const std::string& sha256) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = digests_.insert_or_assign(version, sha256);
  if (!inserted) return;
  order_.push_back(version);
  while (order_.size() > kCapacity) {
    digests_.erase(order_.front());
    order_.pop_front();
  }
}

std::optional<std::string> VersionLedger::Find(int64_t version) const {
  absl::MutexLock lock(&mu_);
  auto it = digests_.find(version);
  if (it == digests_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<ReadVersion> StageDeltaOnServedCopy(
    const std::string& what, const Manifest& m, absl::Span<const weight_sync::DeltaTensor> tensors,
    const PublicationDeps& deps) {
  if (!m.parent_version) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the manifest names no parent_version"));
  }
  return BuildOnServedCopy(
      what, {.parent = m.parent_version, .manifest = &m, .version = m.version, .deltas = tensors},
      deps);
}

absl::StatusOr<ReadVersion> BuildOnServedCopy(const std::string& what,
                                              const ServedCopyUpdate& update,
                                              const PublicationDeps& deps) {
  const Manifest* m = update.manifest;
  if (m != nullptr && deps.ledger != nullptr) {
    RETURN_IF_ERROR(deps.ledger->CheckSameContent(m->version, m->sha256));
  }
  const int64_t served = deps.engine->weight_version();
  const int64_t parent = update.parent.value_or(served);
  if (served != parent) {
    const std::string version =
        m != nullptr ? absl::StrCat(m->version)
                     : (update.version ? absl::StrCat(*update.version) : std::string("new"));
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": its parent is version ", parent, " but this worker serves version ",
                     served, ", so it does not hold the parent (send the full version ", version,
                     ", or the deltas from version ", served, ")"));
  }
  if (m != nullptr && deps.ledger != nullptr && !m->parent_sha256.empty()) {
    const std::optional<std::string> held = deps.ledger->Find(parent);
    if (held.has_value() && *held != m->parent_sha256) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": its parent is version ", parent, " with content ",
                       Short(m->parent_sha256), ", but this worker's version ", parent, " is ",
                       Short(*held), ", so it does not hold the parent"));
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  auto lap = [&t0]() {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - t0).count();
    t0 = now;
    return s;
  };
  CopyCost cost;
  ASSIGN_OR_RETURN(std::vector<model::OwnedTensor> copy,
                   CopyServedWeights(*deps.engine, parent, &cost));
  const double copy_s = lap();
  std::map<std::string, model::OwnedTensor*> by_name;
  for (model::OwnedTensor& t : copy) by_name[t.info.name] = &t;
  auto find = [&](const std::string& name) -> absl::StatusOr<model::OwnedTensor*> {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": tensor ", QuoteForError(name, 128),
                                                     " is not a weight of the served model"));
    }
    return it->second;
  };
  const bool allow_non_finite = model_io::NonFiniteWeightsAllowed();
  // Every tensor is checked against the copy before any is written: a refused update leaves the
  // copy unused either way, but the first error is then the one the sender needs.
  std::set<std::string> named;
  for (const weight_sync::DeltaTensor& t : update.deltas) {
    ASSIGN_OR_RETURN(model::OwnedTensor * target, find(t.name));
    if (target->info.dtype != model_io::DTypeName(t.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor '", t.name, "' is ", model_io::DTypeName(t.dtype),
                       " in the delta but held as ", target->info.dtype));
    }
    if (!named.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": tensor '", t.name, "' sent twice"));
    }
  }
  for (const NamedTensor& t : update.dense) {
    ASSIGN_OR_RETURN(model::OwnedTensor * target, find(t.info.name));
    if (target->info.dtype != t.info.dtype || target->info.shape != t.info.shape ||
        static_cast<int64_t>(t.bytes.size()) != target->num_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": whole tensor '", t.info.name, "' is ", t.info.dtype, " [",
          absl::StrJoin(t.info.shape, ", "), "] (", t.bytes.size(), " bytes) but held as ",
          target->info.dtype, " [", absl::StrJoin(target->info.shape, ", "), "] (",
          target->num_bytes, " bytes): a delta update sends tensors in the served dtype"));
    }
    if (!named.insert(t.info.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensor '", t.info.name, "' sent twice"));
    }
  }
  const weight_sync::ApplyOptions options{.allow_non_finite = allow_non_finite};
  for (const weight_sync::DeltaTensor& t : update.deltas) {
    model::OwnedTensor& target = *by_name.at(t.name);
    absl::Status applied = weight_sync::ApplyDelta(
        t.dtype, t.delta, absl::Span<uint8_t>(target.data, static_cast<size_t>(target.num_bytes)),
        options);
    if (!applied.ok()) return Annotate(applied, absl::StrCat(what, ", tensor '", t.name, "'"));
  }
  for (const NamedTensor& t : update.dense) {
    model::OwnedTensor& target = *by_name.at(t.info.name);
    if (!allow_non_finite) {
      const model_io::DType dtype = *model_io::ParseDType(t.info.dtype);  // held: a float dtype
      const int64_t esize = model_io::DTypeSize(dtype);
      const int64_t found = model_io::FindNonFinite(dtype, t.bytes.data(),
                                                    static_cast<int64_t>(t.bytes.size()) / esize);
      if (found >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": tensor '", t.info.name, "' holds ",
            model_io::NonFiniteName(dtype, t.bytes.data() + found * esize), " at element ", found,
            ": non-finite weights are refused (rl-worker --allow-non-finite-weights accepts "
            "them)"));
      }
    }
    std::memcpy(target.data, t.bytes.data(), t.bytes.size());
  }
  const double apply_s = lap();
  ASSIGN_OR_RETURN(std::unique_ptr<model::Weights> weights,
                   model::WeightsFromOwnedTensors(std::move(copy), deps.model_config));
  if (m != nullptr) {
    if (absl::Status v = VerifyWeights(*weights, *m); !v.ok()) {
      return Annotate(v, absl::StrCat(what, " applied to this worker's version ", parent,
                                      " (the update is corrupt, or the served version ", parent,
                                      " is not its parent's content)"));
    }
  }
  ReadVersion out;
  out.weights = std::move(weights);
  out.version = m != nullptr ? std::optional<int64_t>(m->version) : update.version;
  out.manifest_sha256 = m != nullptr ? m->sha256 : "";
  if (m != nullptr) out.tensor_sha256 = ServedDigests(*out.weights, *m);
  if (update.parent.has_value()) out.delta_parent = parent;
  out.built_on = parent;
  out.phases = absl::StrFormat(
      "copy of the served weights %.3f s (into %s memory; the engine thread held %.3f s of it in "
      "%d hops), apply %.3f s, verify %.3f s",
      copy_s, cost.reused ? "pooled" : "fresh", cost.engine_s, cost.hops, apply_s, lap());
  return out;
}

bool IsDeltaOnlyFolder(const std::string& dir) {
  return IsRegularFile((std::filesystem::path(dir) / weight_sync::kDeltaFileName).string()) &&
         !HasCheckpoint(dir);
}

absl::Status VerifyWeights(const model::Weights& weights, const Manifest& manifest) {
  absl::Status first;
  int bad = 0;
  weights.Visit([&](const model::TensorInfo& info, absl::Span<const uint8_t> bytes) {
    absl::Status s =
        weight_sync::CheckTensorAgainstManifest(manifest, info.name, info.dtype, info.shape, bytes);
    if (!s.ok() && bad++ == 0) first = s;
  });
  if (bad == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(first.message(), bad > 1 ? absl::StrCat(" (", bad, " tensors differ)") : "",
                   "; nothing is staged"));
}

absl::StatusOr<ReadVersion> ReadPublication(const std::string& dir,
                                            std::optional<int64_t> weight_version,
                                            const PublicationDeps& deps) {
  const std::string delta_path =
      (std::filesystem::path(dir) / weight_sync::kDeltaFileName).string();
  if (!IsRegularFile(delta_path)) return ReadDense(dir, weight_version, deps);
  if (dir.size() > static_cast<size_t>(deps.limits.max_path_bytes)) {
    return absl::InvalidArgumentError("model_path: too long");
  }
  ASSIGN_OR_RETURN(DeltaFile delta,
                   weight_sync::ReadDeltaFile(delta_path, deps.limits.max_update_bytes));
  if (*delta.manifest.parent_version != deps.engine->weight_version() && HasCheckpoint(dir)) {
    // The checkpoint beside the delta serves a worker that does not hold the parent.
    return ReadDense(dir, weight_version, deps);
  }
  return ReadDelta(dir, delta, weight_version, deps);
}

}  // namespace rl::worker
