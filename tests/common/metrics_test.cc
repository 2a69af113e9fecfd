#include "common/metrics.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "common/metrics_http.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/loopback.h"

namespace rl {
namespace {

using ::rl::testing::ConnectLoopback;
using ::testing::HasSubstr;

TEST(Metrics, RendersPrometheusText) {
  MetricsRegistry r;
  r.GetCounter("rl_test_requests_total", "Requests.")->Inc(3);
  r.GetGauge("rl_test_queue_size", "Queue.", {{"worker", "a\"b"}})->Set(2.5);
  r.SetGaugeCallback("rl_test_version", "Version.", {}, [] { return 7.0; });
  Histogram* h = r.GetHistogram("rl_test_latency_seconds", "Latency.", {0.1, 1.0});
  h->Observe(0.05);
  h->Observe(0.5);
  h->Observe(5);
  const std::string text = r.RenderPrometheus();
  EXPECT_THAT(text, HasSubstr("# TYPE rl_test_requests_total counter\nrl_test_requests_total 3\n"));
  EXPECT_THAT(text, HasSubstr("rl_test_queue_size{worker=\"a\\\"b\"} 2.5\n"));
  EXPECT_THAT(text, HasSubstr("rl_test_version 7\n"));
  EXPECT_THAT(text, HasSubstr("rl_test_latency_seconds_bucket{le=\"0.1\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("rl_test_latency_seconds_bucket{le=\"1\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("rl_test_latency_seconds_bucket{le=\"+Inf\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("rl_test_latency_seconds_count 3\n"));
  EXPECT_THAT(text, HasSubstr("rl_test_latency_seconds_sum 5.55\n"));
}

TEST(Metrics, SameSeriesIsShared) {
  MetricsRegistry r;
  Counter* a = r.GetCounter("rl_c_total", "c", {{"k", "v"}});
  Counter* b = r.GetCounter("rl_c_total", "c", {{"k", "v"}});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, r.GetCounter("rl_c_total", "c", {{"k", "w"}}));
  r.RemoveSeries("rl_c_total", "k", "w");
  EXPECT_THAT(r.RenderPrometheus(), ::testing::Not(HasSubstr("k=\"w\"")));
}

TEST(Metrics, ConcurrentUpdatesAreExact) {
  MetricsRegistry r;
  Counter* c = r.GetCounter("rl_conc_total", "c");
  Histogram* h = r.GetHistogram("rl_conc_seconds", "h", ExponentialBuckets(1, 2, 4));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c->Inc();
        h->Observe(3);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->value(), 40000);
  EXPECT_EQ(h->count(), 40000u);
  EXPECT_EQ(h->BucketCounts()[2], 40000u);  // 3 falls in (2, 4]
}

TEST(MetricsHttp, ServesMetricsOnLoopback) {
  MetricsRegistry r;
  r.GetGauge("rl_http_up", "Up.")->Set(1);
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, &r);
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client("127.0.0.1", (*server)->port());
  auto res = client.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_THAT(res->body, HasSubstr("rl_http_up 1"));
  (*server)->Stop();
}

// Waits (bounded) until `fd` is closed by the server (read returns 0 or fails).
bool ClosedByServer(int fd) {
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  for (int i = 0; i < 100; ++i) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
    if (n < 0) return false;  // timed out: still open
  }
  return false;
}

// With every connection slot held by idle clients, a new request evicts the oldest one and is
// answered; the server never holds more connections than its cap.
TEST(MetricsHttp, ConnectionCapEvictsTheOldestAndServesNewRequests) {
  MetricsRegistry r;
  HttpServerOptions options;
  options.max_connections = 4;
  options.min_threads = 1;
  options.max_pending = 2;
  options.read_timeout = std::chrono::milliseconds(20000);  // idle clients are not timed out
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, &r, options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<int> idle;
  // Opens one more idle connection and waits (bounded) until the server holds `expected`.
  auto fill = [&](int expected) {
    idle.push_back(ConnectLoopback((*server)->port()));
    EXPECT_GE(idle.back(), 0);
    for (int i = 0; i < 500 && (*server)->open_connections() != expected; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  for (int i = 1; i <= 4; ++i) fill(i);
  ASSERT_EQ((*server)->open_connections(), 4);
  for (int round = 0; round < 3; ++round) {
    httplib::Client client("127.0.0.1", (*server)->port());
    client.set_keep_alive(false);
    auto res = client.Get("/healthz");
    ASSERT_TRUE(res) << round;
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->body, "ok\n");
    EXPECT_LE((*server)->open_connections(), 4);
    // Once the probe's connection is gone, a new idle client takes its thread, so the next
    // probe finds every slot held once more.
    for (int i = 0; i < 500 && (*server)->open_connections() != 3; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    fill(4);
    ASSERT_EQ((*server)->open_connections(), 4);
  }
  // The three probes evicted the three oldest idle connections, in order.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(ClosedByServer(idle[i])) << i;
  for (int fd : idle) close(fd);
  (*server)->Stop();
  EXPECT_EQ((*server)->open_connections(), 0);
}

// A client trickling its request a byte at a time is cut off at the request deadline, however
// steadily the bytes come.
TEST(MetricsHttp, TricklingRequestIsCutAtTheRequestDeadline) {
  MetricsRegistry r;
  HttpServerOptions options;
  options.read_timeout = std::chrono::milliseconds(300);
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, &r, options);
  ASSERT_TRUE(server.ok()) << server.status();
  const int fd = ConnectLoopback((*server)->port());
  ASSERT_GE(fd, 0);
  const std::string head = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  ASSERT_EQ(send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  // One byte every 50 ms (well inside any per-read timeout) for at most 10 s.
  bool cut = false;
  for (int i = 0; i < 200 && !cut; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cut = send(fd, "a", 1, MSG_NOSIGNAL) < 0;
  }
  EXPECT_TRUE(cut || ClosedByServer(fd));
  close(fd);
}

}  // namespace
}  // namespace rl
