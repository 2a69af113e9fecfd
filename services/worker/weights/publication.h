// Publications on a worker: reading a published version from a folder for staging (a dense
// checkpoint, or a delta of the version the worker serves), verifying it against its manifest,
// and remembering which content every version number named (docs/weight-publications.md).
//
//   ReadPublication  off the engine thread. Dense folder: model::LoadWeights, then, with
//                    rl-manifest.json, every served tensor hashed and compared. Delta folder
//                    (weights.rldelta): refused unless the worker serves the delta's parent
//                    version (and, when the ledger knows that version's digest, the parent's
//                    digest matches); then a copy of the served weights is taken into one
//                    pooled arena (model_io::PooledBuffer: a spare of the model's size reused
//                    from stage to stage) whose pages are faulted in on this (staging) thread,
//                    then filled on the engine thread in slices of kCopySliceBytes (one short
//                    hop between engine steps each: a plain memcpy), the delta applied to the
//                    copy here, and the result verified against the child's manifest. A folder with
//                    both uses the delta when the worker holds its parent, else the checkpoint.
//                    Nothing is staged unless all of it is complete and verified.
//   VersionLedger    version -> manifest sha256 of the versions this worker held (bounded,
//                    oldest forgotten first): a publication whose version number was held with
//                    other content is refused.
// Cost: a verified read hashes the model once (SHA-256); a delta costs one copy of the model
// (host memory, the same bound as a staged checkpoint) plus the delta file.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/model_io/model_config.h"
#include "common/request_limits.h"
#include "common/weight_sync/delta_file.h"
#include "common/weight_sync/manifest.h"
#include "services/worker/engine/engine.h"
#include "services/worker/model/weights.h"
#include "services/worker/weights/weight_updates.h"

namespace rl::worker {

class VersionLedger {
 public:
  static constexpr size_t kCapacity = 4096;

  // FAILED_PRECONDITION when `version` was held here with another manifest digest.
  absl::Status CheckSameContent(int64_t version, const std::string& sha256) const;
  // `version` is now served with content `sha256` (a verified manifest's digest).
  void Record(int64_t version, const std::string& sha256);
  // The digest recorded for `version`, if any.
  std::optional<std::string> Find(int64_t version) const;

 private:
  mutable absl::Mutex mu_;
  std::map<int64_t, std::string> digests_ ABSL_GUARDED_BY(mu_);
  std::deque<int64_t> order_ ABSL_GUARDED_BY(mu_);  // insertion order, for the bound
};

// A publication read into owned host memory, complete and verified, waiting to be served.
struct ReadVersion {
  std::unique_ptr<model::Weights> weights;
  std::optional<int64_t> version;  // the manifest's (or the caller's) version
  std::string manifest_sha256;     // "" when the folder had no manifest
  // With a manifest: every served tensor's digest (verified), for the served digest after later
  // partial updates; empty otherwise.
  std::map<std::string, std::string> tensor_sha256;
  std::optional<int64_t> delta_parent;  // set when built from a delta
  // Set when built on a copy of the served weights (a delta, or whole tensors verified against
  // a manifest): the version copied. Serving it after another version was activated would undo
  // that one, so activation refuses it then.
  std::optional<int64_t> built_on;
  int64_t delta_bytes = 0;
  std::string phases;  // a delta's wall time per phase ("copy 1.2 s, apply ..."), for the answer
  // Folder identity for a dense read (model::FolderIdentity before the read), "" for a delta;
  // and the folder the runner may reload it from ("" for a delta: its weights exist only here).
  std::string identity;
  std::string reload_path;
};

struct PublicationDeps {
  engine::Engine* engine = nullptr;  // the served weights (delta parents)
  model_io::ModelConfig model_config;
  RequestLimits limits;
  const VersionLedger* ledger = nullptr;
};

inline constexpr int64_t kCopySliceBytes = int64_t{32} << 20;

// Reads `dir` (see the file comment). `weight_version`, when set, must equal the manifest's
// version (INVALID_ARGUMENT otherwise); without a manifest it is the version. Errors name the
// folder and the problem (a tensor that does not match, the parent the worker lacks).
absl::StatusOr<ReadVersion> ReadPublication(const std::string& dir,
                                            std::optional<int64_t> weight_version,
                                            const PublicationDeps& deps);

// What BuildOnServedCopy builds: deltas and whole tensors over a copy of the served weights.
struct ServedCopyUpdate {
  // The version the copy must be of (checked before and during the copy); unset: the served one.
  std::optional<int64_t> parent;
  // Verify the result against it when set (and refuse a version number held with other
  // content, or a parent whose held digest differs from manifest->parent_sha256).
  const weight_sync::Manifest* manifest = nullptr;
  // The result's version when no manifest names it (unset: current + 1 at activation).
  std::optional<int64_t> version;
  absl::Span<const weight_sync::DeltaTensor> deltas;
  absl::Span<const NamedTensor> dense;
};

// The delta core, for every transport that carries a delta (a folder, a tensor stream, a group
// receive): checks that this worker serves the parent (version, and digest when known), copies
// the served weights in engine-thread slices, checks every delta and whole tensor against the
// copy (name, dtype, shape, size) and applies them (a delta's payload checked whole before a
// byte is written, NaN / ±Inf refused unless allowed), then verifies the result against the
// manifest when there is one. `what` names the source in errors. Nothing is kept on error.
absl::StatusOr<ReadVersion> BuildOnServedCopy(const std::string& what,
                                              const ServedCopyUpdate& update,
                                              const PublicationDeps& deps);

// BuildOnServedCopy of a delta folder's tensors: the parent and version are `manifest`'s.
absl::StatusOr<ReadVersion> StageDeltaOnServedCopy(
    const std::string& what, const weight_sync::Manifest& manifest,
    absl::Span<const weight_sync::DeltaTensor> tensors, const PublicationDeps& deps);

// Whether `dir` holds a delta file and no checkpoint (it cannot be applied while asleep).
bool IsDeltaOnlyFolder(const std::string& dir);

// OK when every tensor of `weights` matches `manifest`; else FAILED_PRECONDITION naming the
// first tensor that does not (and how many do not).
absl::Status VerifyWeights(const model::Weights& weights, const weight_sync::Manifest& manifest);

}  // namespace rl::worker
