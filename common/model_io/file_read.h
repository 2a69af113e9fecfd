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
// Checking while reading: OwnedFileReader reads a prefix first (a header that says how to check
// the rest), then the rest in parallel in pieces of kCheckPieceBytes, handing each piece to a
// visitor right after it landed, while it is still in the CPU cache (safetensors.cc scans weights
// for NaN / Inf that way: no second pass over memory).
//
// Also: a cheap nesting-depth check for JSON texts, run before a parser sees them.
// Thread-safe (no shared state but the spare pool, which is locked).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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
  friend class OwnedFileReader;
  OwnedFile(std::string path, uint8_t* data, size_t size, size_t capacity)
      : path_(std::move(path)), data_(data), size_(size), capacity_(capacity) {}
  std::string path_;
  uint8_t* data_;
  size_t size_;
  size_t capacity_;  // bytes mapped at data_ (>= size_ when a spare was reused)
};

// Sees one piece of a file right after it was read into owned memory: `offset` is where the
// piece starts in the file. Called from several reading threads at once, on disjoint pieces of
// at most kCheckPieceBytes that together cover the file from the end of the prefix on; must be
// thread-safe.
using PieceVisitor = std::function<void(size_t offset, absl::Span<const uint8_t> piece)>;

// Reads one file in two steps: a prefix, serially (ReadPrefix, any number of times), then the
// rest in parallel (ReadRest), each piece visited as it lands. Same checks and errors as
// OwnedFile::Read. Not thread-safe (one caller drives it).
class OwnedFileReader {
 public:
  // Opens `path` and allocates (or takes a spare for) its bytes; reads nothing.
  static absl::StatusOr<OwnedFileReader> Open(const std::string& path, int64_t max_bytes);
  OwnedFileReader(OwnedFileReader&& other) noexcept;
  OwnedFileReader& operator=(OwnedFileReader&&) = delete;
  ~OwnedFileReader();

  size_t size() const { return file_->size_; }
  // All of the file's future bytes: only [0, bytes read so far) hold the file yet.
  absl::Span<const uint8_t> bytes() const { return file_->bytes(); }
  // Reads up to byte `end` (clamped to the size) serially.
  absl::Status ReadPrefix(size_t end);
  // Reads everything after the prefix on a few threads, calling `visit` (may be empty) on each
  // piece, and hands the bytes over. The reader is spent afterwards.
  absl::StatusOr<std::shared_ptr<OwnedFile>> ReadRest(const PieceVisitor& visit);

 private:
  OwnedFileReader(int fd, std::shared_ptr<OwnedFile> file) : fd_(fd), file_(std::move(file)) {}
  int fd_;
  std::shared_ptr<OwnedFile> file_;
  size_t done_ = 0;  // bytes [0, done_) are read
};

// Owned page-aligned anonymous memory of `size` bytes for a working copy (a delta's copy of the
// served weights: services/worker/weights/publication.h): a spare of about that size from the
// pool when there is one (no page fault, no zeroing), else freshly mapped; given back to the pool
// when destroyed, like an OwnedFile's bytes. Prefault() faults every page in on the calling
// thread, so that writes into it later (on a latency-bound thread) fault nothing. Contents are
// unspecified until written. Thread-compatible.
class PooledBuffer {
 public:
  // ResourceExhausted when the memory cannot be mapped.
  static absl::StatusOr<std::shared_ptr<PooledBuffer>> Take(size_t size);
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;
  ~PooledBuffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Whether it came from the spare pool.
  bool reused() const { return reused_; }
  // Writes every page once (MADV_POPULATE_WRITE, Linux 5.14+; else one byte per page).
  void Prefault();

 private:
  PooledBuffer(uint8_t* data, size_t size, size_t capacity, bool reused)
      : data_(data), size_(size), capacity_(capacity), reused_(reused) {}
  uint8_t* data_;
  size_t size_;
  size_t capacity_;
  bool reused_;
};

// Largest file read by default: checkpoints shards (64 GiB) and small JSON files (16 MiB).
inline constexpr int64_t kMaxShardBytes = int64_t{64} << 30;
inline constexpr int64_t kMaxJsonFileBytes = int64_t{16} << 20;
// Buffers kept for reuse: released files of at least this size, at most this many.
inline constexpr size_t kMinSpareBytes = size_t{1} << 20;
inline constexpr size_t kMaxSpareBuffers = 64;
// Size of the pieces a PieceVisitor sees: small enough to be still in a core's L2 when visited.
inline constexpr size_t kCheckPieceBytes = size_t{512} << 10;
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
