#include "common/model_io/file_read.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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

}  // namespace

absl::StatusOr<std::shared_ptr<OwnedFile>> OwnedFile::Read(const std::string& path,
                                                           int64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", FileKind(st.st_mode), ", not a regular file"));
  }
  if (st.st_size < 0 || st.st_size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is ", st.st_size,
                                                   " bytes, more than the limit of ", max_bytes));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  uint8_t* data = nullptr;
  if (size > 0) {
    // Anonymous memory with transparent huge pages: filling 1 GB costs ~500 page faults
    // instead of ~250k, which keeps a full read within reach of the old zero-copy mmap.
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", size, " bytes to read ", path));
    }
    (void)::madvise(p, size, MADV_HUGEPAGE);
    data = static_cast<uint8_t*>(p);
  }
  std::shared_ptr<OwnedFile> file(new OwnedFile(path, data, size));
  // Large files are read by a few threads in parallel (page cache → memory is bound by the
  // page-fault and copy rate of one core).
  constexpr size_t kPerThread = size_t{64} << 20;
  const size_t num_threads = std::clamp<size_t>(size / kPerThread, 1,
      std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8));
  const size_t stride = (size + num_threads - 1) / num_threads;
  std::vector<absl::Status> results(num_threads);
  auto read_range = [&](size_t t) {
    size_t done = t * stride;
    const size_t end = std::min(size, done + stride);
    while (done < end) {
      const size_t want = std::min<size_t>(end - done, size_t{1} << 30);
      const ssize_t got = ::pread(fd, data + done, want, static_cast<off_t>(done));
      if (got < 0) {
        if (errno == EINTR) continue;
        results[t] = absl::InternalError(
            absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
        return;
      }
      if (got == 0) {
        results[t] = absl::DataLossError(absl::StrCat(
            path, " shrank while being read (", done, " of ", size,
            " bytes): truncated or being rewritten"));
        return;
      }
      done += static_cast<size_t>(got);
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < num_threads; ++t) threads.emplace_back(read_range, t);
  read_range(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& r : results) RETURN_IF_ERROR(r);
  return file;
}

OwnedFile::~OwnedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

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
