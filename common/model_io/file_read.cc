#include "common/model_io/file_read.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace rl::model_io {

namespace {

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// Mappings of released files kept for the next reads (see file_read.h). In reclaimable mode
// each spare is MADV_FREE'd: the kernel may take its pages back under memory pressure (a later
// read then faults fresh zero pages in, as for new memory); otherwise they are reused with no
// page fault and no zeroing.
class SparePool {
 public:
  static SparePool& Get() {
    static SparePool* pool = new SparePool();  // never destroyed: used from destructors
    return *pool;
  }

  // The smallest spare of at least `size` bytes and at most twice that; nullptr when none.
  uint8_t* Take(size_t size, size_t* capacity) {
    std::lock_guard<std::mutex> lock(mu_);
    auto best = spares_.end();
    for (auto it = spares_.begin(); it != spares_.end(); ++it) {
      if (it->capacity >= size && it->capacity / 2 <= size &&
          (best == spares_.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best == spares_.end()) return nullptr;
    uint8_t* data = best->data;
    *capacity = best->capacity;
    spares_.erase(best);
    return data;
  }

  void DropAll() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Spare& s : spares_) ::munmap(s.data, s.capacity);
    spares_.clear();
  }

  void SetReclaimable(bool reclaimable) { reclaimable_.store(reclaimable); }

  void Give(uint8_t* data, size_t capacity) {
    if (reclaimable_.load()) (void)::madvise(data, capacity, MADV_FREE);
    std::lock_guard<std::mutex> lock(mu_);
    spares_.push_back({data, capacity});
    while (spares_.size() > kMaxSpareBuffers) {
      ::munmap(spares_.front().data, spares_.front().capacity);
      spares_.pop_front();
    }
  }

 private:
  struct Spare {
    uint8_t* data;
    size_t capacity;
  };
  std::atomic<bool> reclaimable_{false};
  std::mutex mu_;
  std::deque<Spare> spares_;  // oldest first
};

// Fresh anonymous memory in 4 KiB pages. No MADV_HUGEPAGE: with the usual `defrag=madvise`
// setting a huge-page fault compacts memory synchronously, which made the first update after
// start 10x slower than later ones (1.2 s vs 0.1 s for 1 GB) whenever free memory was
// fragmented (by the page cache, typically); 4 KiB faults cost the same every time.
uint8_t* MapFresh(size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

// `size` bytes (> 0) of owned memory: a spare of about that size when `size` is at least
// kMinSpareBytes and the pool has one (`*reused`), else fresh; `*capacity` is what is mapped.
// nullptr when it cannot be mapped. Give it back with ReleaseMemory.
uint8_t* TakeMemory(size_t size, size_t* capacity, bool* reused) {
  uint8_t* data = size >= kMinSpareBytes ? SparePool::Get().Take(size, capacity) : nullptr;
  *reused = data != nullptr;
  if (data == nullptr) {
    *capacity = size;
    data = MapFresh(size);
  }
  return data;
}

// Memory from TakeMemory (nullptr: nothing): a spare for the next reads when large enough, else
// unmapped.
void ReleaseMemory(uint8_t* data, size_t capacity) {
  if (data == nullptr) return;
  if (capacity >= kMinSpareBytes) {
    SparePool::Get().Give(data, capacity);
  } else {
    ::munmap(data, capacity);
  }
}

// Reads [begin, end) of `fd` into `data`, in preads that end at multiples of `chunk` (file
// offsets), calling `visit` (when set) after each one.
absl::Status ReadRange(int fd, const std::string& path, uint8_t* data, size_t size, size_t begin,
                       size_t end, size_t chunk, const PieceVisitor& visit) {
  size_t done = begin;
  while (done < end) {
    const size_t want = std::min(end - done, chunk - done % chunk);
    size_t got_total = 0;
    while (got_total < want) {
      const ssize_t got = ::pread(fd, data + done + got_total, want - got_total,
                                  static_cast<off_t>(done + got_total));
      if (got < 0) {
        if (errno == EINTR) continue;
        return absl::InternalError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
      }
      if (got == 0) {
        return absl::DataLossError(absl::StrCat(path, " shrank while being read (",
                                                done + got_total, " of ", size,
                                                " bytes): truncated or being rewritten"));
      }
      got_total += static_cast<size_t>(got);
    }
    if (visit) visit(done, absl::Span<const uint8_t>(data + done, want));
    done += want;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OwnedFileReader> OwnedFileReader::Open(const std::string& path, int64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", FileKind(st.st_mode), ", not a regular file"));
  }
  if (st.st_size < 0 || st.st_size > max_bytes) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", st.st_size, " bytes, more than the limit of ", max_bytes));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  uint8_t* data = nullptr;  // an empty file: no memory
  size_t capacity = 0;
  bool reused = false;
  if (size > 0 && (data = TakeMemory(size, &capacity, &reused)) == nullptr) {
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", size, " bytes to read ", path));
  }
  return OwnedFileReader(fd, std::shared_ptr<OwnedFile>(new OwnedFile(path, data, size, capacity)));
}

OwnedFileReader::OwnedFileReader(OwnedFileReader&& other) noexcept
    : fd_(other.fd_), file_(std::move(other.file_)), done_(other.done_) {
  other.fd_ = -1;
}

OwnedFileReader::~OwnedFileReader() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status OwnedFileReader::ReadPrefix(size_t end) {
  end = std::min(end, size());
  if (end <= done_) return absl::OkStatus();
  RETURN_IF_ERROR(
      ReadRange(fd_, file_->path_, file_->data_, size(), done_, end, size_t{1} << 30, nullptr));
  done_ = end;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<OwnedFile>> OwnedFileReader::ReadRest(const PieceVisitor& visit) {
  const size_t size = this->size();
  const size_t begin = std::min(done_, size);
  // Large files are read by a few threads in parallel (page cache → memory is bound by the
  // page-fault and copy rate of one core). With a visitor, each thread reads piece by piece so
  // that the visitor finds its piece in cache.
  constexpr size_t kPerThread = size_t{64} << 20;
  const size_t rest = size - begin;
  const size_t num_threads = std::clamp<size_t>(
      rest / kPerThread, 1, std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8));
  const size_t chunk = visit ? kCheckPieceBytes : size_t{1} << 30;
  // Thread ranges, like pieces, start at multiples of kCheckPieceBytes (file offsets), so a
  // piece boundary never splits an element of a tensor aligned to its element size.
  const size_t base = begin / kCheckPieceBytes * kCheckPieceBytes;
  const size_t stride = ((size - base + num_threads - 1) / num_threads + kCheckPieceBytes - 1) /
                        kCheckPieceBytes * kCheckPieceBytes;
  std::vector<absl::Status> results(num_threads);
  auto read_range = [&](size_t t) {
    const size_t from = std::min(size, std::max(begin, base + t * stride));
    const size_t to = std::min(size, base + (t + 1) * stride);
    results[t] = ReadRange(fd_, file_->path_, file_->data_, size, from, to, chunk, visit);
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < num_threads; ++t) threads.emplace_back(read_range, t);
  read_range(0);
  for (std::thread& t : threads) t.join();
  ::close(fd_);
  fd_ = -1;
  for (const absl::Status& r : results) RETURN_IF_ERROR(r);
  done_ = size;
  return std::move(file_);
}

absl::StatusOr<std::shared_ptr<OwnedFile>> OwnedFile::Read(const std::string& path,
                                                           int64_t max_bytes) {
  ASSIGN_OR_RETURN(OwnedFileReader reader, OwnedFileReader::Open(path, max_bytes));
  return reader.ReadRest(nullptr);
}

namespace {

// Faults every page of [data, data + size) in with a write (MADV_POPULATE_WRITE, Linux 5.14+;
// else one write per page).
void PopulateWrite(uint8_t* data, size_t size) {
  constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE
  if (::madvise(data, size, kPopulateWrite) != 0) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    for (size_t i = 0; i < size; i += page) data[i] = 0;
  }
}

}  // namespace

void ReserveSpareBuffers(absl::Span<const size_t> sizes) {
  for (const size_t size : sizes) {
    if (size < kMinSpareBytes) continue;
    uint8_t* data = MapFresh(size);
    if (data == nullptr) return;
    PopulateWrite(data, size);  // fault every page in now
    SparePool::Get().Give(data, size);
  }
}

absl::StatusOr<std::shared_ptr<PooledBuffer>> PooledBuffer::Take(size_t size) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t want = std::max(page, (size + page - 1) / page * page);
  size_t capacity = 0;
  bool reused = false;
  uint8_t* data = TakeMemory(want, &capacity, &reused);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot map ", want, " bytes"));
  }
  return std::shared_ptr<PooledBuffer>(new PooledBuffer(data, size, capacity, reused));
}

PooledBuffer::~PooledBuffer() { ReleaseMemory(data_, capacity_); }

// The bytes asked for only: a reused spare may be larger (and MADV_FREEd); its tail stays out.
void PooledBuffer::Prefault() { PopulateWrite(data_, size_); }

void DropSpareBuffers() { SparePool::Get().DropAll(); }

void SetSpareBuffersReclaimable(bool reclaimable) { SparePool::Get().SetReclaimable(reclaimable); }

OwnedFile::~OwnedFile() { ReleaseMemory(data_, capacity_); }

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, int64_t max_bytes) {
  absl::StatusOr<std::shared_ptr<OwnedFile>> file = OwnedFile::Read(path, max_bytes);
  if (!file.ok()) return file.status();
  return std::string((*file)->text());
}

absl::Status CheckJsonDepth(absl::string_view text, int max_depth, absl::string_view what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": JSON nested deeper than ", max_depth, " levels"));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::OkStatus();
}

}  // namespace rl::model_io
