#include "common/metrics_http.h"

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace rl {

namespace {

// httplib's TaskQueue (one task = one connection, served until it closes) as an elastic pool:
// a task never waits behind a busy thread while fewer than `max_threads` exist.
class ElasticTaskQueue final : public httplib::TaskQueue {
 public:
  ElasticTaskQueue(int min_threads, int max_threads)
      : min_threads_(min_threads), max_threads_(max_threads) {}
  ~ElasticTaskQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fn));
    if (idle_ == 0 && num_threads_ < max_threads_) {
      ++num_threads_;
      std::thread([this] { Work(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

  void shutdown() override {
    std::unique_lock<std::mutex> lock(mu_);
    shutting_down_ = true;
    cv_.notify_all();
    done_.wait(lock, [&] { return num_threads_ == 0; });
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      const bool got = cv_.wait_for(lock, std::chrono::seconds(10), [&] {
        return !jobs_.empty() || shutting_down_;
      });
      --idle_;
      if (jobs_.empty()) {
        // Idle long enough (or shutting down): threads above the minimum go away.
        if (shutting_down_ || (!got && num_threads_ > min_threads_)) break;
        continue;
      }
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
    if (--num_threads_ == 0) done_.notify_all();
  }

  const int min_threads_;
  const int max_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_;
  std::deque<std::function<void()>> jobs_;
  int num_threads_ = 0;
  int idle_ = 0;
  bool shutting_down_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, const MetricsRegistry* registry,
    const HttpServerOptions& options) {
  if (options.min_threads < 1 || options.max_connections < options.min_threads) {
    return absl::InvalidArgumentError("metrics: need 1 <= min_threads <= max_connections");
  }
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->server_ = std::make_unique<httplib::Server>();
  httplib::Server& srv = *s->server_;
  srv.new_task_queue = [options] {
    return new ElasticTaskQueue(options.min_threads, options.max_connections);
  };
  const auto usec = [](std::chrono::milliseconds d) {
    return std::pair<time_t, time_t>(d.count() / 1000, (d.count() % 1000) * 1000);
  };
  srv.set_read_timeout(usec(options.read_timeout).first, usec(options.read_timeout).second);
  srv.set_write_timeout(usec(options.write_timeout).first, usec(options.write_timeout).second);
  srv.set_keep_alive_timeout(options.keep_alive_timeout.count());
  srv.set_keep_alive_max_count(static_cast<size_t>(options.keep_alive_max_requests));
  srv.set_payload_max_length(options.max_payload_bytes);
  srv.Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->RenderPrometheus(), "text/plain; version=0.0.4");
  });
  srv.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  const int bound = port == 0 ? srv.bind_to_any_port(host)
                              : (srv.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot bind ", host, ":", port));
  }
  s->port_ = bound;
  httplib::Server* raw = s->server_.get();
  s->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace rl
