// The worker's metrics port under slow, idle and flooding clients: /healthz (the liveness probe)
// is always answered and the open descriptors stay bounded.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "tests/reliability/bad_input_test_util.h"
#include "tests/testing/loopback.h"

namespace rl::testing {
namespace {

namespace fs = std::filesystem;
using grpc::StatusCode;

// Slow and idle clients on the metrics port never starve /healthz (the liveness probe).
TEST_F(BadInputTest, MetricsPortSurvivesSlowloris) {
  std::string port_text =
      worker_->WaitForLine("metrics on http://127.0.0.1:", std::chrono::seconds(10));
  const int port = std::atoi(port_text.c_str());
  ASSERT_GT(port, 0) << worker_->Log();
  auto connect_to = [&]() {
    const int fd = ConnectLoopback(port);
    EXPECT_GE(fd, 0);
    return fd;
  };
  std::vector<int> slow, idle;
  for (int i = 0; i < 16; ++i) {
    slow.push_back(connect_to());
    idle.push_back(connect_to());
    const char* start = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
    (void)!send(slow.back(), start, strlen(start), MSG_NOSIGNAL);
  }
  std::atomic<bool> stop{false};
  std::thread dripper([&] {
    // One header byte per connection every 500 ms: under the read timeout, never finished.
    while (!stop) {
      for (int fd : slow) (void)!send(fd, "X", 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10);
  client.set_read_timeout(10);
  int ok = 0;
  for (int i = 0; i < 20; ++i) {
    auto res = client.Get(i % 4 == 3 ? "/metrics" : "/healthz");
    if (res && res->status == 200) ++ok;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(ok, 20);
  // Idle connections are closed by the server (read timeout), not held forever.
  char byte;
  timeval tv{15, 0};
  setsockopt(idle[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  EXPECT_EQ(recv(idle[0], &byte, 1, 0), 0);
  stop = true;
  dripper.join();
  for (int fd : slow) close(fd);
  for (int fd : idle) close(fd);
  ExpectHealthy("after slowloris");
}

// Open descriptors of a process (its /proc/PID/fd entries).
int CountFds(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it(absl::StrCat("/proc/", pid, "/fd"), ec), end; !ec && it != end;
       it.increment(ec)) {
    ++n;
  }
  return n;
}

// A flood of 320 slow and idle connections, replaced as soon as the server cuts them (as a
// slowloris tool does), on the metrics port: every /healthz probe with the kubelet's default
// probe timeout (1 s) is answered, and the worker's open descriptors stay bounded (at most the
// connection cap of 128 + 17 waiting, never one per flood connection). Before the listen backlog
// was raised, a burst of connects overflowed httplib's backlog of 5 and SYNs were dropped.
TEST_F(BadInputTest, MetricsPortBoundsAFloodOfSlowAndIdleConnections) {
  std::string port_text =
      worker_->WaitForLine("metrics on http://127.0.0.1:", std::chrono::seconds(10));
  const int port = std::atoi(port_text.c_str());
  ASSERT_GT(port, 0) << worker_->Log();
  const int baseline_fds = CountFds(worker_->pid());
  ASSERT_GT(baseline_fds, 0);
  constexpr int kFlood = 320;
  std::vector<int> fds(kFlood, -1);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> reconnects{0};
  // Even slots trickle a request head one byte at a time, odd slots send nothing.
  auto open_slot = [&](int i) {
    fds[i] = ConnectLoopback(port, /*timeout_s=*/1);
    if (fds[i] >= 0 && i % 2 == 0) {
      const char* start = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
      (void)!send(fds[i], start, strlen(start), MSG_NOSIGNAL);
    }
  };
  for (int i = 0; i < kFlood; ++i) open_slot(i);
  std::thread flood([&] {
    // Bounded: at most 200 rounds of 100 ms.
    for (int round = 0; round < 200 && !stop; ++round) {
      for (int i = 0; i < kFlood && !stop; ++i) {
        char byte;
        const bool cut =
            fds[i] < 0 || (i % 2 == 0 ? send(fds[i], "X", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0
                                      : recv(fds[i], &byte, 1, MSG_DONTWAIT) == 0);
        if (cut) {
          if (fds[i] >= 0) close(fds[i]);
          open_slot(i);
          reconnects.fetch_add(1);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  // The worker's open descriptors, sampled every 10 ms while the flood runs.
  std::atomic<int> max_fds{0};
  std::thread sampler([&] {
    for (int i = 0; i < 3000 && !stop; ++i) {
      const int n = CountFds(worker_->pid());
      if (n > max_fds.load()) max_fds = n;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1);
  client.set_read_timeout(1);
  client.set_keep_alive(false);
  int answered = 0;
  for (int i = 0; i < 20; ++i) {
    auto res = client.Get("/healthz");
    if (res && res->status == 200 && res->body == "ok\n") {
      ++answered;
    } else {
      ADD_FAILURE() << "probe " << i << ": "
                    << (res ? absl::StrCat("status ", res->status)
                            : httplib::to_string(res.error()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }
  stop = true;
  flood.join();
  sampler.join();
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  std::cout << "[metrics-flood] " << answered << "/20 probes answered, worker fds " << baseline_fds
            << " -> max " << max_fds.load() << ", " << reconnects.load()
            << " flood connections cut and replaced\n";
  EXPECT_EQ(answered, 20);
  // The flood really exceeded the cap: the server cut connections to stay under it.
  EXPECT_GT(reconnects.load(), 0);
  // Connections: 128 served + 17 waiting for a thread + 1 being accepted; a few more for the
  // worker's own transient descriptors.
  EXPECT_LE(max_fds.load(), baseline_fds + 128 + 17 + 1 + 16);
  ExpectHealthy("after the connection flood");
}

}  // namespace
}  // namespace rl::testing
