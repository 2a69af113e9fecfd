#include "services/worker/weight_sync/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace rl::weight_sync {
namespace {

constexpr size_t kMaxSendChunk = size_t{16} << 20;
constexpr size_t kMaxRecvChunk = size_t{4} << 20;
constexpr int kMaxIov = 256;

std::string ErrnoText(int err) { return std::strerror(err); }

absl::Status SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::InternalError(absl::StrCat("fcntl(O_NONBLOCK): ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

void ConfigureDataSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

// Waits for `events` on `socket` for at most `timeout_ms`: OK when ready, DEADLINE_EXCEEDED,
// or UNAVAILABLE after Shutdown().
absl::Status WaitReady(const Socket& socket, int16_t events, int timeout_ms,
                       const std::string& what) {
  pollfd p{socket.fd(), events, 0};
  while (true) {
    if (socket.shut_down()) return absl::UnavailableError(absl::StrCat(what, ": socket closed"));
    int n = poll(&p, 1, timeout_ms);
    if (n > 0) return absl::OkStatus();
    if (n == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": peer made no progress for ", timeout_ms, " ms"));
    }
    if (errno != EINTR) {
      return absl::InternalError(absl::StrCat(what, ": poll: ", ErrnoText(errno)));
    }
  }
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};

absl::StatusOr<std::unique_ptr<addrinfo, AddrInfoDeleter>> Resolve(const std::string& host,
                                                                   int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  return std::unique_ptr<addrinfo, AddrInfoDeleter>(result);
}

}  // namespace

int64_t ElapsedMs(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

Socket::~Socket() {
  if (fd_ >= 0) close(fd_);
}

Socket::Socket(Socket&& other) noexcept : fd_(other.fd_), shut_down_(other.shut_down_.load()) {
  other.fd_ = -1;
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    shut_down_.store(other.shut_down_.load());
    other.fd_ = -1;
  }
  return *this;
}

void Socket::Shutdown() {
  if (fd_ < 0 || shut_down_.exchange(true)) return;
  shutdown(fd_, SHUT_RDWR);
}

absl::StatusOr<Socket> ListenTcp(const std::string& host, int port) {
  auto addrs = Resolve(host, port, /*passive=*/true);
  if (!addrs.ok()) return addrs.status();
  std::string last_error = "no address";
  for (addrinfo* a = addrs->get(); a != nullptr; a = a->ai_next) {
    Socket s(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) {
      last_error = ErrnoText(errno);
      continue;
    }
    int one = 1;
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    // Accepted sockets inherit the receive buffer size only when it is set before listen().
    if (bind(s.fd(), a->ai_addr, a->ai_addrlen) != 0 || listen(s.fd(), 128) != 0) {
      last_error = ErrnoText(errno);
      continue;
    }
    if (absl::Status st = SetNonBlocking(s.fd()); !st.ok()) return st;
    return s;
  }
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", host, ":", port, ": ", last_error));
}

absl::StatusOr<int> LocalPort(const Socket& socket) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return absl::InternalError(absl::StrCat("getsockname: ", ErrnoText(errno)));
  }
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

absl::StatusOr<Socket> ConnectTcp(const std::string& host, int port, Clock::time_point deadline) {
  const auto start = Clock::now();
  auto addrs = Resolve(host, port, /*passive=*/false);
  if (!addrs.ok()) return addrs.status();
  std::string last_error = "no address";
  auto backoff = std::chrono::milliseconds(5);
  while (true) {
    for (addrinfo* a = addrs->get(); a != nullptr; a = a->ai_next) {
      Socket s(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (!s.valid()) {
        last_error = ErrnoText(errno);
        continue;
      }
      ConfigureDataSocket(s.fd());
      if (absl::Status st = SetNonBlocking(s.fd()); !st.ok()) return st;
      if (connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
          last_error = ErrnoText(errno);
          continue;
        }
        pollfd p{s.fd(), POLLOUT, 0};
        int n;
        do {
          n = poll(&p, 1, std::max(1, RemainingMs(deadline)));
        } while (n < 0 && errno == EINTR);
        if (n <= 0) {
          last_error = n == 0 ? "connect timed out" : ErrnoText(errno);
          continue;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          last_error = ErrnoText(err);
          continue;
        }
      }
      return s;
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  return absl::DeadlineExceededError(absl::StrCat("no sender reachable at ", host, ":", port,
                                                  " after ", ElapsedMs(start),
                                                  " ms (last error: ", last_error, ")"));
}

absl::StatusOr<Socket> AcceptTcp(const Socket& listener, Clock::time_point deadline) {
  while (true) {
    int fd = accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      ConfigureDataSocket(fd);
      return Socket(fd);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
      return absl::InternalError(absl::StrCat("accept: ", ErrnoText(errno)));
    }
    int left = RemainingMs(deadline);
    if (left <= 0) return absl::DeadlineExceededError("accept: deadline passed");
    absl::Status st = WaitReady(listener, POLLIN, left, "accept");
    if (absl::IsDeadlineExceeded(st)) return absl::DeadlineExceededError("accept: deadline passed");
    if (!st.ok()) return st;
  }
}

absl::Status SendAll(const Socket& socket, const std::vector<absl::Span<const uint8_t>>& segments,
                     std::chrono::milliseconds stall, const std::string& what) {
  size_t seg = 0;
  size_t offset = 0;  // into segments[seg]
  size_t total = 0;
  size_t sent = 0;
  for (const auto& s : segments) total += s.size();
  iovec iov[kMaxIov];
  while (true) {
    while (seg < segments.size() && offset == segments[seg].size()) {
      ++seg;
      offset = 0;
    }
    if (seg == segments.size()) return absl::OkStatus();
    int n_iov = 0;
    size_t batch = 0;
    for (size_t i = seg; i < segments.size() && n_iov < kMaxIov && batch < kMaxSendChunk; ++i) {
      size_t begin = i == seg ? offset : 0;
      size_t len = std::min(segments[i].size() - begin, kMaxSendChunk - batch);
      if (len == 0) continue;
      iov[n_iov].iov_base = const_cast<uint8_t*>(segments[i].data() + begin);
      iov[n_iov].iov_len = len;
      ++n_iov;
      batch += len;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n_iov;
    ssize_t n = sendmsg(socket.fd(), &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        absl::Status st = WaitReady(socket, POLLOUT, static_cast<int>(stall.count()), what);
        if (!st.ok()) {
          return absl::Status(st.code(), absl::StrCat(st.message(), " after sending ", sent, " of ",
                                                      total, " bytes"));
        }
        continue;
      }
      return absl::UnavailableError(absl::StrCat(what, ": connection lost after sending ", sent,
                                                 " of ", total, " bytes (", ErrnoText(errno), ")"));
    }
    sent += static_cast<size_t>(n);
    size_t left = static_cast<size_t>(n);
    while (left > 0) {
      size_t avail = segments[seg].size() - offset;
      if (avail == 0) {
        ++seg;
        offset = 0;
        continue;
      }
      size_t take = std::min(left, avail);
      offset += take;
      left -= take;
    }
  }
}

absl::Status RecvAll(const Socket& socket, uint8_t* dst, size_t size,
                     std::chrono::milliseconds stall, const std::string& what,
                     const std::function<void(const uint8_t*, size_t)>& on_chunk,
                     size_t* received) {
  size_t got = 0;
  auto report = [&] {
    if (received != nullptr) *received = got;
  };
  while (got < size) {
    ssize_t n = recv(socket.fd(), dst + got, std::min(size - got, kMaxRecvChunk), 0);
    if (n > 0) {
      if (on_chunk) on_chunk(dst + got, static_cast<size_t>(n));
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      report();
      return absl::UnavailableError(
          absl::StrCat(what, ": connection closed by peer after ", got, " of ", size, " bytes"));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      absl::Status st = WaitReady(socket, POLLIN, static_cast<int>(stall.count()), what);
      if (!st.ok()) {
        report();
        return absl::Status(st.code(), absl::StrCat(st.message(), " after receiving ", got, " of ",
                                                    size, " bytes"));
      }
      continue;
    }
    report();
    return absl::UnavailableError(absl::StrCat(what, ": connection lost after receiving ", got,
                                               " of ", size, " bytes (", ErrnoText(errno), ")"));
  }
  report();
  return absl::OkStatus();
}

bool PeerClosedOrReadable(const Socket& socket) {
  pollfd p{socket.fd(), POLLIN, 0};
  return poll(&p, 1, 0) != 0;
}

}  // namespace rl::weight_sync
