// WorkerDiscovery (services/router/discovery/worker_discovery.h) over a scripted resolver and a
// recording pool: names scale up and down, a failed lookup keeps the fleet, an empty answer
// empties it, two names sharing an address, and the --worker-dns parser.
#include "services/router/discovery/worker_discovery.h"

#include <map>
#include <set>

#include "gtest/gtest.h"

namespace rl::router::discovery {
namespace {

// The DNS answers a test scripts, and the pool's Add / Remove calls it records.
class Script {
 public:
  void Answer(const std::string& name, absl::StatusOr<std::vector<std::string>> ips) {
    absl::MutexLock lock(&mu_);
    answers_.insert_or_assign(name, std::move(ips));
  }
  WorkerDiscovery::Resolve resolver() {
    return [this](const std::string& name) -> absl::StatusOr<std::vector<std::string>> {
      absl::MutexLock lock(&mu_);
      auto it = answers_.find(name);
      if (it == answers_.end()) return std::vector<std::string>{};
      return it->second;
    };
  }
  WorkerDiscovery::Pool pool() {
    WorkerDiscovery::Pool p;
    p.add = [this](const std::string& a) {
      absl::MutexLock lock(&mu_);
      pool_.insert(a);
      return absl::OkStatus();
    };
    p.remove = [this](const std::string& a) {
      absl::MutexLock lock(&mu_);
      ++removals_;
      return pool_.erase(a) > 0 ? absl::OkStatus() : absl::NotFoundError(a);
    };
    return p;
  }
  std::set<std::string> in_pool() {
    absl::MutexLock lock(&mu_);
    return pool_;
  }
  int removals() {
    absl::MutexLock lock(&mu_);
    return removals_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, absl::StatusOr<std::vector<std::string>>> answers_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> pool_ ABSL_GUARDED_BY(mu_);
  int removals_ ABSL_GUARDED_BY(mu_) = 0;
};

DiscoveryOptions Manual() {
  DiscoveryOptions o;
  o.interval = std::chrono::hours(1);  // rounds only through RunOnce
  o.retry = std::chrono::hours(1);
  return o;
}

TEST(WorkerDiscoveryTest, ScalesUpAndDownWithTheAnswers) {
  Script script;
  script.Answer("w.svc", std::vector<std::string>{"10.0.0.1"});
  WorkerDiscovery d({{"w.svc", 50051}}, script.resolver(), script.pool(), Manual());
  // The first round ran in the constructor.
  EXPECT_EQ(script.in_pool(), (std::set<std::string>{"10.0.0.1:50051"}));
  script.Answer("w.svc", std::vector<std::string>{"10.0.0.1", "10.0.0.2", "fd00::3"});
  EXPECT_TRUE(d.RunOnce());
  EXPECT_EQ(script.in_pool(),
            (std::set<std::string>{"10.0.0.1:50051", "10.0.0.2:50051", "[fd00::3]:50051"}));
  EXPECT_EQ(d.addresses().size(), 3u);
  script.Answer("w.svc", std::vector<std::string>{"10.0.0.2"});
  EXPECT_TRUE(d.RunOnce());
  EXPECT_EQ(script.in_pool(), (std::set<std::string>{"10.0.0.2:50051"}));
  // Scaled to zero: the name answers nothing (NXDOMAIN / no records).
  script.Answer("w.svc", std::vector<std::string>{});
  EXPECT_TRUE(d.RunOnce());
  EXPECT_TRUE(script.in_pool().empty());
  EXPECT_TRUE(d.addresses().empty());
}

TEST(WorkerDiscoveryTest, AFailedLookupKeepsTheFleet) {
  Script script;
  script.Answer("w.svc", std::vector<std::string>{"10.0.0.1", "10.0.0.2"});
  WorkerDiscovery d({{"w.svc", 7}}, script.resolver(), script.pool(), Manual());
  script.Answer("w.svc", absl::UnavailableError("server timed out"));
  EXPECT_FALSE(d.RunOnce());
  EXPECT_EQ(script.in_pool(), (std::set<std::string>{"10.0.0.1:7", "10.0.0.2:7"}));
  EXPECT_EQ(script.removals(), 0);
  // Back: the answer applies again.
  script.Answer("w.svc", std::vector<std::string>{"10.0.0.2"});
  EXPECT_TRUE(d.RunOnce());
  EXPECT_EQ(script.in_pool(), (std::set<std::string>{"10.0.0.2:7"}));
}

// Two names that share an address: it stays while either names it.
TEST(WorkerDiscoveryTest, AnAddressStaysWhileAnyNameHasIt) {
  Script script;
  script.Answer("a.svc", std::vector<std::string>{"10.0.0.1"});
  script.Answer("b.svc", std::vector<std::string>{"10.0.0.1", "10.0.0.9"});
  WorkerDiscovery d({{"a.svc", 1}, {"b.svc", 1}}, script.resolver(), script.pool(), Manual());
  EXPECT_EQ(script.in_pool(), (std::set<std::string>{"10.0.0.1:1", "10.0.0.9:1"}));
  script.Answer("a.svc", std::vector<std::string>{});
  EXPECT_TRUE(d.RunOnce());
  EXPECT_EQ(script.in_pool(), (std::set<std::string>{"10.0.0.1:1", "10.0.0.9:1"}));
  script.Answer("b.svc", std::vector<std::string>{"10.0.0.9"});
  EXPECT_TRUE(d.RunOnce());
  EXPECT_EQ(script.in_pool(), (std::set<std::string>{"10.0.0.9:1"}));
}

// The thread re-resolves on its own every interval.
TEST(WorkerDiscoveryTest, TheThreadReResolves) {
  Script script;
  script.Answer("w.svc", std::vector<std::string>{"10.0.0.1"});
  DiscoveryOptions o;
  o.interval = std::chrono::milliseconds(10);
  WorkerDiscovery d({{"w.svc", 9}}, script.resolver(), script.pool(), o);
  script.Answer("w.svc", std::vector<std::string>{"10.0.0.4"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (script.in_pool() != std::set<std::string>{"10.0.0.4:9"} &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(script.in_pool(), (std::set<std::string>{"10.0.0.4:9"}));
}

TEST(WorkerDiscoveryTest, ParsesTargets) {
  auto t = ParseDnsTarget("rlfleet-worker.default.svc.cluster.local:50051");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name, "rlfleet-worker.default.svc.cluster.local");
  EXPECT_EQ(t->port, 50051);
  for (const std::string bad : {"noport", ":50051", "w.svc:0", "w.svc:70000", "w.svc:x"}) {
    const auto r = ParseDnsTarget(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--worker-dns"), std::string::npos) << r.status();
  }
  EXPECT_FALSE(ParseDnsTarget(std::string(300, 'a') + ":1").ok());
}

}  // namespace
}  // namespace rl::router::discovery
