// Bounded, owning reads of model files (checkpoints, config.json, index files).
//
// Every file the worker serves from is read into memory the process owns: nothing keeps a live
// view of the file, so a checkpoint rewritten or truncated after it was read changes nothing
// and can never fault (no mmap, no SIGBUS). Files are opened with O_NONBLOCK and checked with
// fstat before a byte is read: anything but a regular file (a FIFO, a directory, a device) is
// refused with a clear error instead of blocking the caller, and a size above `max_bytes` is
// refused before any allocation. A file that shrinks while it is read is a DataLoss error.
//
// Memory: fresh buffers are anonymous 4 KiB pages, filled by a few threads in parallel (page
// cache -> memory is bound by one core's fault and copy rate). A released buffer of at least
// kMinSpareBytes is not unmapped but kept as a spare (at most kMaxSpareBuffers, oldest dropped
// first); the next read of a file of about its size (a weight update: the same shard layout)
// reuses it with no page fault and no zeroing. Steady-state resident memory of a process that
// updates its weights is therefore up to two copies. SetSpareBuffersReclaimable(true) marks
// spares MADV_FREE, so the kernel can reclaim them under memory pressure like cache; but writing
// into such pages again costs about twice the plain copy (measured: 0.30 vs 0.16 CPU s per GB
// read from the page cache), so it is off by default.
//
// Also: a cheap nesting-depth check for JSON texts, run before a parser sees them.
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace rl::model_io {

// Bytes of one file, owned (page-aligned anonymous memory).
class OwnedFile {
 public:
  // Reads all of `path`. Errors: NotFound (cannot open), InvalidArgument (not a regular file,
  // larger than `max_bytes`), DataLoss (changed size while being read), Internal (I/O error).
  static absl::StatusOr<std::shared_ptr<OwnedFile>> Read(const std::string& path,
                                                         int64_t max_bytes);
  OwnedFile(const OwnedFile&) = delete;
  OwnedFile& operator=(const OwnedFile&) = delete;
  ~OwnedFile();

  absl::Span<const uint8_t> bytes() const { return {data_, size_}; }
  absl::string_view text() const { return {reinterpret_cast<const char*>(data_), size_}; }
  const std::string& path() const { return path_; }

 private:
  OwnedFile(std::string path, uint8_t* data, size_t size, size_t capacity)
      : path_(std::move(path)), data_(data), size_(size), capacity_(capacity) {}
  std::string path_;
  uint8_t* data_;
  size_t size_;
  size_t capacity_;  // bytes mapped at data_ (>= size_ when a spare was reused)
};

// Largest file read by default: checkpoints shards (64 GiB) and small JSON files (16 MiB).
inline constexpr int64_t kMaxShardBytes = int64_t{64} << 30;
inline constexpr int64_t kMaxJsonFileBytes = int64_t{16} << 20;
// Buffers kept for reuse: released files of at least this size, at most this many.
inline constexpr size_t kMinSpareBytes = size_t{1} << 20;
inline constexpr size_t kMaxSpareBuffers = 64;
// Deepest JSON nesting accepted in model files (real ones stay below 10).
inline constexpr int kMaxJsonDepth = 64;

// Maps, faults in and hands to the spare pool one buffer per size (sizes below kMinSpareBytes
// are skipped): called after the startup load so that the first weight update already reuses
// memory instead of faulting fresh pages in. Best effort (a failed allocation reserves less).
void ReserveSpareBuffers(absl::Span<const size_t> sizes);

// Unmaps every spare buffer (a worker releasing its memory: ReleaseMemory).
void DropSpareBuffers();

// Whether spares given back from now on are marked MADV_FREE (reclaimable under memory pressure,
// slower to refill); default false. Process-wide.
void SetSpareBuffersReclaimable(bool reclaimable);

// Reads a small text file (config.json, index files) with the checks of OwnedFile::Read.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          int64_t max_bytes = kMaxJsonFileBytes);

// InvalidArgument ("<what>: JSON nested deeper than N") when `text` nests arrays/objects deeper
// than `max_depth`. Strings are skipped; malformed JSON is left for the parser to report.
absl::Status CheckJsonDepth(absl::string_view text, int max_depth, absl::string_view what);

}  // namespace rl::model_io
