// Safetensors checkpoints: a reader with strict header validation, sharded checkpoints through
// `model.safetensors.index.json`, and a writer.
//
// File layout: u64 little-endian header length N, N bytes of JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data
// region. The reader checks every invariant before handing out a byte span: the header fits
// in the file, it is a JSON object, every dtype is known, every shape×dtype size equals its
// offset range, ranges lie inside the data region, and the ranges tile the data region
// contiguously without overlap. Malformed files are InvalidArgument / DataLoss errors naming
// the file and the tensor, never a crash.
//
// Only regular files are opened (O_NONBLOCK + fstat first: a FIFO or a directory is an error,
// never a hang), the header is at most kMaxSafetensorsHeaderBytes and nests at most
// kMaxJsonDepth levels.
//
// Non-finite weights: a checkpoint holding NaN or ±Inf in any F32 / F16 / BF16 tensor is refused
// (InvalidArgument naming the file, the tensor, the value and its first element) unless allowed.
// The scan runs on each piece of a file right after it was read into owned memory, while the
// piece is in cache (file_read.h), so it adds no pass over memory; tensors whose offset is not a
// multiple of their element size (never written so by the reference writer) are scanned after.
//
// Cost: opening reads every file once into memory the process owns (model_io/file_read.h), so
// a checkpoint rewritten or truncated on disk after opening changes nothing and never faults.
// A Checkpoint keeps its buffers alive for as long as it (or a copy) lives; spans into it stay
// valid until then. Checkpoint is immutable after opening and safe to share across threads.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_io/dtype.h"
#include "common/model_io/file_read.h"

namespace rl::model_io {

// The reference implementation's limit on the JSON header.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100 << 20;

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  absl::Span<const uint8_t> data;  // exactly NumElements() * DTypeSize(dtype) bytes

  int64_t NumElements() const;
};

// Parses and validates the safetensors layout of `bytes` (header + data). `source` names the
// file in errors. Returned views point into `bytes`.
absl::StatusOr<std::vector<TensorView>> ParseSafetensors(absl::Span<const uint8_t> bytes,
                                                         const std::string& source);

class Checkpoint {
 public:
  Checkpoint() = default;

  // Null when absent.
  const TensorView* Find(const std::string& name) const;
  // Every tensor, sorted by name.
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // Files backing the tensors, and their sizes in bytes (same order).
  std::vector<std::string> files() const;
  std::vector<size_t> file_sizes() const;

 private:
  friend absl::StatusOr<Checkpoint> OpenSafetensorsFile(const std::string& path);
  friend absl::StatusOr<Checkpoint> OpenCheckpoint(const std::string& dir);
  absl::Status AddFile(const std::string& path, const std::vector<std::string>* only);

  std::vector<std::shared_ptr<OwnedFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

// Whether OpenCheckpoint / OpenSafetensorsFile accept non-finite weights. Process-wide, default
// false (rl-worker --allow-non-finite-weights sets it); a ScopedNonFiniteWeightsAllowed on the
// calling thread overrides it. Thread-safe.
void SetNonFiniteWeightsAllowed(bool allowed);
bool NonFiniteWeightsAllowed();

// Accepts non-finite weights in the checkpoints this thread opens while it lives (a worker
// re-reading weights it served and spilled itself). Nests.
class ScopedNonFiniteWeightsAllowed {
 public:
  ScopedNonFiniteWeightsAllowed();
  ~ScopedNonFiniteWeightsAllowed();
  ScopedNonFiniteWeightsAllowed(const ScopedNonFiniteWeightsAllowed&) = delete;
  ScopedNonFiniteWeightsAllowed& operator=(const ScopedNonFiniteWeightsAllowed&) = delete;
};

// Opens one .safetensors file.
absl::StatusOr<Checkpoint> OpenSafetensorsFile(const std::string& path);
// Opens DIR/model.safetensors.index.json (sharded) when present, else DIR/model.safetensors,
// else every DIR/*.safetensors. A tensor listed twice or listed in the index but missing in
// its shard is an error.
absl::StatusOr<Checkpoint> OpenCheckpoint(const std::string& dir);

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  absl::Span<const uint8_t> data;
};

// Writes `tensors` (in the given order) as one safetensors file, atomically (temp + rename).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Streaming form for checkpoints larger than memory: `specs` give name, dtype and shape (their
// `data` is ignored) and `fill(i, out)` writes the bytes of specs[i] into `out`, one tensor
// at a time, in order.
using TensorFill = std::function<absl::Status(size_t index, absl::Span<uint8_t> out)>;
absl::Status WriteSafetensorsStreaming(const std::string& path,
                                       const std::vector<TensorToWrite>& specs,
                                       const TensorFill& fill,
                                       const std::map<std::string, std::string>& metadata = {});

// Writes tensors into DIR: a single model.safetensors when the total is at most
// `max_shard_bytes` (0: no limit), else model-0000i-of-0000n.safetensors shards plus
// model.safetensors.index.json. `fill` as above with indices into `specs`.
absl::Status WriteCheckpoint(const std::string& dir, const std::vector<TensorToWrite>& specs,
                             const TensorFill& fill, int64_t max_shard_bytes = 0);
absl::Status WriteCheckpoint(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                             int64_t max_shard_bytes = 0);

}  // namespace rl::model_io
