#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace rl {

using Clock = std::chrono::steady_clock;

// The open connections, oldest first. A connection is shut down (never closed) from outside:
// its own thread sees end-of-stream, removes it and closes the descriptor, so a descriptor
// number is never shut down after it was closed and reused.
class ConnectionTable {
 public:
  void Add(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t seq = next_++;
    by_age_.emplace(seq, fd);
    seq_of_[fd] = seq;
  }

  void Remove(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = seq_of_.find(fd);
    if (it == seq_of_.end()) return;  // evicted already
    by_age_.erase(it->second);
    seq_of_.erase(it);
  }

  // Shuts down the oldest open connection; false when there is none.
  bool EvictOldest() {
    std::lock_guard<std::mutex> lock(mu_);
    if (by_age_.empty()) return false;
    EvictLocked(by_age_.begin()->second);
    return true;
  }

  void EvictAll() {
    std::lock_guard<std::mutex> lock(mu_);
    while (!by_age_.empty()) EvictLocked(by_age_.begin()->second);
  }

  int size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(by_age_.size());
  }

 private:
  void EvictLocked(int fd) {
    ::shutdown(fd, SHUT_RDWR);
    by_age_.erase(seq_of_[fd]);
    seq_of_.erase(fd);
  }

  mutable std::mutex mu_;
  std::map<uint64_t, int> by_age_;  // accept order -> descriptor
  absl::flat_hash_map<int, uint64_t> seq_of_;
  uint64_t next_ = 0;
};

namespace {

int PollMs(Clock::duration d) {
  return static_cast<int>(std::clamp<int64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(d).count(), 0, 60'000));
}

bool WaitFor(int fd, short events, Clock::duration timeout) {
  pollfd p{fd, events, 0};
  const Clock::time_point deadline = Clock::now() + timeout;
  for (;;) {
    const int n = ::poll(&p, 1, PollMs(deadline - Clock::now()));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

// httplib::Stream over a connected socket, buffered, with a deadline for a whole request:
// reads fail once `read_timeout` has passed since StartRequest(), however the bytes trickle in.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int fd, const HttpServerOptions& options) : fd_(fd), options_(options) {}

  void StartRequest() { read_deadline_ = Clock::now() + options_.read_timeout; }

  bool is_readable() const override {
    return begin_ < end_ || WaitFor(fd_, POLLIN, read_deadline_ - Clock::now());
  }
  bool is_writable() const override { return WaitFor(fd_, POLLOUT, options_.write_timeout); }

  ssize_t read(char* ptr, size_t size) override {
    if (begin_ == end_) {
      if (!WaitFor(fd_, POLLIN, read_deadline_ - Clock::now())) return -1;
      ssize_t n;
      do {
        n = ::recv(fd_, buffer_, sizeof(buffer_), 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      begin_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - begin_);
    std::copy_n(buffer_ + begin_, n, ptr);
    begin_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(::getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  void Address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    ip.clear();
    port = 0;
    if (get(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
      port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
      inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
      port = ntohs(a->sin6_port);
    }
    ip = text;
  }

  const int fd_;
  const HttpServerOptions& options_;
  Clock::time_point read_deadline_ = Clock::now();
  char buffer_[4096];
  size_t begin_ = 0;
  size_t end_ = 0;
};

// httplib::Server that serves each connection itself (httplib's own loop has no per-request
// deadline and no connection table): keep-alive with the configured limits, every request
// through httplib's parser and handlers (process_request).
class BoundedServer final : public httplib::Server {
 public:
  BoundedServer(const HttpServerOptions& options, std::shared_ptr<ConnectionTable> table)
      : options_(options), table_(std::move(table)) {}

  // httplib 0.11 listens with a backlog of 5: a burst of connections then overflows the
  // kernel's accept queue and new SYNs (a liveness probe's too) are dropped, to be retried only
  // a second later. listen() on a listening socket just updates the backlog.
  bool SetBacklog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }

 private:
  bool process_and_close_socket(socket_t sock) override {
    table_->Add(sock);
    DeadlineStream stream(sock, options_);
    bool ok = true;
    for (int served = 0; served < options_.keep_alive_max_requests; ++served) {
      // The first request must start within the read timeout, later ones within keep-alive.
      const Clock::duration wait = served == 0 ? Clock::duration(options_.read_timeout)
                                               : Clock::duration(options_.keep_alive_timeout);
      if (svr_sock_ == INVALID_SOCKET || !WaitFor(sock, POLLIN, wait)) break;
      stream.StartRequest();
      bool closed = false;
      ok = process_request(stream, served + 1 == options_.keep_alive_max_requests, closed, nullptr);
      if (!ok || closed) break;
    }
    table_->Remove(sock);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  const HttpServerOptions options_;
  const std::shared_ptr<ConnectionTable> table_;
};

// httplib's TaskQueue (one task = one connection, served until it closes) as an elastic pool:
// a task never waits behind a busy thread while fewer than `max_threads` exist. With every
// thread busy, a new task evicts the oldest connection (its thread then takes the task), and
// at most `max_pending` tasks wait: past that the listener blocks until one is taken.
class ElasticTaskQueue final : public httplib::TaskQueue {
 public:
  ElasticTaskQueue(const HttpServerOptions& options, std::shared_ptr<ConnectionTable> table)
      : min_threads_(options.min_threads),
        max_threads_(options.max_connections),
        max_pending_(static_cast<size_t>(options.max_pending)),
        table_(std::move(table)) {}
  ~ElasticTaskQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fn));
    // Every queued task needs a thread of its own: an idle one or one starting up.
    if (jobs_.size() <= static_cast<size_t>(idle_ + starting_)) {
      cv_.notify_one();
      return;
    }
    if (num_threads_ < max_threads_) {
      ++num_threads_;
      ++starting_;
      std::thread([this] { Work(); }).detach();
      return;
    }
    table_->EvictOldest();
    while (jobs_.size() > max_pending_ && !shutting_down_) {
      if (taken_.wait_for(lock, std::chrono::milliseconds(100)) == std::cv_status::timeout) {
        table_->EvictOldest();
      }
    }
  }

  void shutdown() override {
    std::unique_lock<std::mutex> lock(mu_);
    shutting_down_ = true;
    cv_.notify_all();
    taken_.notify_all();
    // Open connections end now instead of at their timeouts; queued ones are served (and see
    // the server stopped) by the remaining threads.
    table_->EvictAll();
    done_.wait(lock, [&] { return num_threads_ == 0; });
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    --starting_;
    for (;;) {
      ++idle_;
      const bool got = cv_.wait_for(lock, std::chrono::seconds(10),
                                    [&] { return !jobs_.empty() || shutting_down_; });
      --idle_;
      if (jobs_.empty()) {
        // Idle long enough (or shutting down): threads above the minimum go away.
        if (shutting_down_ || (!got && num_threads_ > min_threads_)) break;
        continue;
      }
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      taken_.notify_all();
      lock.unlock();
      fn();
      lock.lock();
    }
    if (--num_threads_ == 0) done_.notify_all();
  }

  const int min_threads_;
  const int max_threads_;
  const size_t max_pending_;
  const std::shared_ptr<ConnectionTable> table_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable taken_;
  std::condition_variable done_;
  std::deque<std::function<void()>> jobs_;
  int num_threads_ = 0;
  int idle_ = 0;      // threads waiting for a task
  int starting_ = 0;  // threads spawned that have not looked for a task yet
  bool shutting_down_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, const MetricsRegistry* registry,
    const HttpServerOptions& options) {
  if (options.min_threads < 1 || options.max_connections < options.min_threads ||
      options.max_pending < 1 || options.keep_alive_max_requests < 1 ||
      options.listen_backlog < 1) {
    return absl::InvalidArgumentError(
        "metrics: need 1 <= min_threads <= max_connections, and max_pending, "
        "keep_alive_max_requests and listen_backlog >= 1");
  }
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->connections_ = std::make_shared<ConnectionTable>();
  s->server_ = std::make_unique<BoundedServer>(options, s->connections_);
  httplib::Server& srv = *s->server_;
  srv.new_task_queue = [options, table = s->connections_] {
    return new ElasticTaskQueue(options, table);
  };
  // httplib applies these as SO_RCVTIMEO / SO_SNDTIMEO to each accepted socket: a send that
  // blocks on a full buffer gives up after the write timeout.
  const auto sec_usec = [](std::chrono::milliseconds d) {
    return std::pair<time_t, time_t>(d.count() / 1000, (d.count() % 1000) * 1000);
  };
  srv.set_read_timeout(sec_usec(options.read_timeout).first, sec_usec(options.read_timeout).second);
  srv.set_write_timeout(sec_usec(options.write_timeout).first,
                        sec_usec(options.write_timeout).second);
  srv.set_payload_max_length(options.max_payload_bytes);
  srv.Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->RenderPrometheus(), "text/plain; version=0.0.4");
  });
  srv.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  const int bound =
      port == 0 ? srv.bind_to_any_port(host) : (srv.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot bind ", host, ":", port));
  }
  if (!static_cast<BoundedServer&>(srv).SetBacklog(options.listen_backlog)) {
    return absl::InternalError(absl::StrCat("metrics: listen backlog ", options.listen_backlog,
                                            ": ", std::strerror(errno)));
  }
  s->port_ = bound;
  httplib::Server* raw = s->server_.get();
  s->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

int MetricsHttpServer::open_connections() const { return connections_ ? connections_->size() : 0; }

void MetricsHttpServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace rl
