// TCP sockets for the weight-sync control and data channels, with every wait bounded.
//
// Sockets are non-blocking; each send/receive loop waits in poll() for at most its stall
// budget between progress, so a silent peer turns into DEADLINE_EXCEEDED and a closed one
// into UNAVAILABLE, never a hang. Data sockets get TCP_NODELAY; their kernel buffers are left
// to TCP autotuning (an explicit SO_SNDBUF/SO_RCVBUF would disable it and is capped by
// net.core.[rw]mem_max; on loopback autotuning measured faster). Sends gather up to 16 MiB
// per sendmsg() call (scatter-gather, no copies), receives ask for up to 4 MiB per recv().
// SIGPIPE is never raised (MSG_NOSIGNAL).
//
// Thread safety: a Socket is owned by one thread at a time, except Shutdown(), which any
// thread may call to make pending and future waits on it fail promptly.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace rl::weight_sync {

using Clock = std::chrono::steady_clock;

// Milliseconds from `start` to now, for error messages.
int64_t ElapsedMs(Clock::time_point start);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // shutdown(SHUT_RDWR): wakes a thread blocked in poll() on this socket. The fd stays open
  // until destruction, so a concurrent user never sees a reused descriptor.
  void Shutdown();
  bool shut_down() const { return shut_down_.load(); }

 private:
  int fd_ = -1;
  std::atomic<bool> shut_down_{false};
};

// Binds and listens on host:port (port 0: ephemeral). `host` may be a name or an IPv4/IPv6
// literal; "0.0.0.0" binds every interface.
absl::StatusOr<Socket> ListenTcp(const std::string& host, int port);
// The local port of a bound socket.
absl::StatusOr<int> LocalPort(const Socket& socket);

// Connects to host:port, retrying refused or unreachable attempts until `deadline`.
// DEADLINE_EXCEEDED names the address, the elapsed time and the last error.
absl::StatusOr<Socket> ConnectTcp(const std::string& host, int port, Clock::time_point deadline);

// Accepts one connection, waiting at most until `deadline` (DEADLINE_EXCEEDED). The returned
// socket is configured for data (non-blocking, TCP_NODELAY).
absl::StatusOr<Socket> AcceptTcp(const Socket& listener, Clock::time_point deadline);

// Sends the concatenation of `segments`. `stall` bounds each wait for buffer space;
// `what` names the transfer in errors.
absl::Status SendAll(const Socket& socket, const std::vector<absl::Span<const uint8_t>>& segments,
                     std::chrono::milliseconds stall, const std::string& what);

// Receives exactly `size` bytes into `dst`. `stall` bounds each wait for data. `on_chunk`,
// when set, sees every chunk right after it arrived (e.g. to checksum while hot in cache).
// `*received` (optional) reports how many bytes arrived before an error.
absl::Status RecvAll(const Socket& socket, uint8_t* dst, size_t size,
                     std::chrono::milliseconds stall, const std::string& what,
                     const std::function<void(const uint8_t*, size_t)>& on_chunk = nullptr,
                     size_t* received = nullptr);

// True when the peer has closed or reset the connection or sent unexpected bytes (a socket
// that should be idle became readable). Does not block.
bool PeerClosedOrReadable(const Socket& socket);

}  // namespace rl::weight_sync
