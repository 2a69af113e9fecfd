#include "common/metrics.h"

#include <thread>
#include <vector>

#include "common/metrics_http.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace rl {
namespace {

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

}  // namespace
}  // namespace rl
