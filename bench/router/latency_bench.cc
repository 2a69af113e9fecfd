#include "bench/router/latency_bench.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/server_runner.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "rl/v1/router.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"
#include "services/router/router_server.h"
#include "tests/testing/fake_worker.h"

namespace rl::bench {
namespace {

using Clock = std::chrono::steady_clock;
using router::testing::AsyncGenerate;
using router::testing::FakeWorker;
using router::testing::FakeWorkerOptions;

template <typename Stub>
bool Call(Stub& stub, const rl::v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  auto reader = stub.Generate(&ctx, req);
  rl::v1::GenerateResponse msg;
  bool final_seen = false;
  while (reader->Read(&msg)) final_seen |= msg.has_final();
  return reader->Finish().ok() && final_seen;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// Sequential latencies (us) of `n` calls after a short warm-up.
template <typename Stub>
absl::StatusOr<std::vector<double>> Sequential(Stub& stub, const rl::v1::GenerateRequest& req,
                                               int n) {
  for (int i = 0; i < 50; ++i) Call(stub, req);
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    if (!Call(stub, req)) return absl::InternalError("a Generate call failed");
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return us;
}

struct LoadResult {
  std::vector<double> us;  // per request
  double seconds = 0;
  int failed = 0;
  std::string first_error;
};

// `streams` calls kept in flight (each one that ends starts the next) until `total` ran, on
// asynchronous clients spread over `stubs`.
template <typename Stub>
LoadResult ClosedLoop(const std::vector<std::unique_ptr<Stub>>& stubs,
                      const rl::v1::GenerateRequest& req, int streams, int total) {
  struct State {
    absl::Mutex mu;
    LoadResult result;
    int done = 0;
    std::atomic<int> next{0};
  } st;
  st.result.us.reserve(static_cast<size_t>(total));
  std::function<void()> start_one = [&] {
    const int i = st.next.fetch_add(1);
    if (i >= total) return;
    const auto t0 = Clock::now();
    AsyncGenerate<Stub>::Start(
        stubs[static_cast<size_t>(i) % stubs.size()].get(), req,
        [&, t0](const grpc::Status& s, bool final_seen) {
          const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
          start_one();  // before this one counts as done: `st` lives until the last is counted
          absl::MutexLock lock(&st.mu);
          st.result.us.push_back(us);
          if (!s.ok() || !final_seen) {
            if (st.result.failed++ == 0) {
              st.result.first_error = absl::StrFormat("%d: %s", s.error_code(), s.error_message());
            }
          }
          ++st.done;
        },
        "", true, std::chrono::seconds(300));
  };
  const auto t0 = Clock::now();
  for (int i = 0; i < streams; ++i) start_one();
  {
    absl::MutexLock lock(&st.mu);
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(st.mu) { return st.done >= total; };
    st.mu.Await(absl::Condition(&all));
  }
  st.result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  absl::MutexLock lock(&st.mu);
  return std::move(st.result);
}

template <typename Service>
std::vector<std::unique_ptr<typename Service::Stub>> Stubs(const std::string& address, int n) {
  std::vector<std::unique_ptr<typename Service::Stub>> out;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("rl-bench-channel", i);  // a connection each
    out.push_back(Service::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
  }
  return out;
}

// An rl-router binary run as a child process (stderr dropped); its threads and RSS from
// /proc/PID/status.
class RouterProcess {
 public:
  static absl::StatusOr<std::unique_ptr<RouterProcess>> Start(const std::string& binary,
                                                              const std::vector<std::string>& args,
                                                              const std::vector<int>& cpus) {
    int out[2];
    if (pipe(out) != 0) return absl::InternalError("pipe failed");
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError("fork failed");
    if (pid == 0) {
      if (!cpus.empty() && !PinToCpus(cpus).ok()) _exit(126);
      dup2(out[1], 1);
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 2);
      close(out[0]);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(binary.c_str()));
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    close(out[1]);
    std::unique_ptr<RouterProcess> p(new RouterProcess(pid));
    std::string line;
    const auto limit = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < limit) {
      pollfd fd{out[0], POLLIN, 0};
      if (poll(&fd, 1, 1000) <= 0) continue;
      char c;
      if (read(out[0], &c, 1) != 1) break;
      if (c != '\n') {
        line += c;
        continue;
      }
      if (absl::StartsWith(line, "listening on ")) {
        p->address_ = line.substr(13);
        break;
      }
      line.clear();
    }
    close(out[0]);
    if (p->address_.empty()) return absl::InternalError(binary + " did not start listening");
    return p;
  }
  ~RouterProcess() {
    kill(pid_, SIGTERM);
    int status;
    waitpid(pid_, &status, 0);
  }
  const std::string& address() const { return address_; }
  // CPU time (user + system) the process used so far, in microseconds.
  double CpuMicros() const {
    std::ifstream in(absl::StrFormat("/proc/%d/stat", pid_));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) return 0;
    std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the ")".
    int64_t utime = 0, stime = 0;
    if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime)) {
      return 0;
    }
    return static_cast<double>(utime + stime) * 1e6 / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  // Threads and VmRSS (KiB) now.
  std::pair<int, int64_t> Status() const {
    std::ifstream in(absl::StrFormat("/proc/%d/status", pid_));
    std::string line;
    int threads = 0;
    int64_t rss = 0;
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t:"), absl::SkipEmpty());
      if (f.size() < 2) continue;
      if (f[0] == "Threads") (void)absl::SimpleAtoi(f[1], &threads);
      if (f[0] == "VmRSS") (void)absl::SimpleAtoi(f[1], &rss);
    }
    return {threads, rss};
  }

 private:
  explicit RouterProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  std::string address_;
};

// Samples a router process's peak threads and RSS while alive.
class Sampler {
 public:
  explicit Sampler(const RouterProcess& p) : p_(p) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        auto [threads, rss] = p_.Status();
        peak_threads_ = std::max(peak_threads_.load(), threads);
        peak_rss_ = std::max(peak_rss_.load(), rss);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
  ~Sampler() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  int peak_threads() const { return peak_threads_.load(); }
  int64_t peak_rss_kb() const { return peak_rss_.load(); }

 private:
  const RouterProcess& p_;
  std::atomic<bool> stop_{false};
  std::atomic<int> peak_threads_{0};
  std::atomic<int64_t> peak_rss_{0};
  std::thread thread_;
};

bool Supports(const std::string& binary, const std::string& flag) {
  const std::string cmd = binary + " --help 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return false;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  pclose(f);
  return absl::StrContains(text, flag);
}

absl::Status SideBySide(const LatencyBenchConfig& c, const std::vector<std::string>& workers,
                        const rl::v1::GenerateRequest& req, std::ostream& out) {
  int max_streams = 1;
  for (int s : c.streams) max_streams = std::max(max_streams, s);
  // Direct to the worker, once per concurrency: the baseline the router's cost is added to.
  auto worker_stubs = Stubs<rl::v1::Worker>(workers[0], 8);
  ASSIGN_OR_RETURN(std::vector<double> direct_seq, Sequential(*worker_stubs[0], req, c.requests));
  std::vector<LoadResult> direct;
  for (int s : c.streams) direct.push_back(ClosedLoop(worker_stubs, req, s, s * c.rounds));

  out << absl::StrFormat(
      "\nside by side: rl-router processes, %d fake workers, %d-token completions, %d requests "
      "per stream\n",
      c.num_workers, c.completion_tokens, c.rounds);
  if (!c.router_cpus.empty()) {
    out << "  routers pinned to CPUs " << absl::StrJoin(c.router_cpus, ",") << "\n";
  }
  out << absl::StrFormat("  %-26s %8s %8s %11s %11s %11s %11s %11s %7s %9s %7s\n", "router",
                         "streams", "threads", "RSS/stream", "added p50", "added p99", "requests/s",
                         "CPU/request", "busy", "req/s/core", "failed");
  for (const std::string& spec : c.router_binaries) {
    const size_t eq = spec.find('=');
    const std::string label = eq == std::string::npos ? spec : spec.substr(0, eq);
    const std::string binary = eq == std::string::npos ? spec : spec.substr(eq + 1);
    // The fake workers share the bench's cores with thousands of client streams: health checks
    // get slack so an overloaded bench host does not make the router mark them dead.
    std::vector<std::string> args = {"--tokenizer",
                                     c.tokenizer_dir,
                                     "--port",
                                     "0",
                                     "--log-level",
                                     "error",
                                     "--health-timeout-ms",
                                     "30000",
                                     "--health-failures",
                                     "100"};
    for (const std::string& w : workers) {
      args.push_back("--worker");
      args.push_back(w);
    }
    if (Supports(binary, "--max-in-flight")) {
      args.push_back("--max-in-flight");
      args.push_back(std::to_string(max_streams));
    }
    ASSIGN_OR_RETURN(auto router, RouterProcess::Start(binary, args, c.router_cpus));
    auto stubs = Stubs<rl::v1::Router>(router->address(), 8);
    {
      Sampler sampler(*router);
      const double cpu0 = router->CpuMicros();
      const auto t0 = Clock::now();
      ASSIGN_OR_RETURN(std::vector<double> seq, Sequential(*stubs[0], req, c.requests));
      const double wall = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      const double cpu_total = router->CpuMicros() - cpu0;
      const double cpu = cpu_total / (c.requests + 50);
      sampler.Stop();
      out << absl::StrFormat(
          "  %-26s %8s %8d %11s %8.0f us %8.0f us %11s %8.0f us %6.0f%% %10.0f %7d\n", label,
          "1 (seq)", sampler.peak_threads(), "-",
          Percentile(seq, 0.5) - Percentile(direct_seq, 0.5),
          Percentile(seq, 0.99) - Percentile(direct_seq, 0.99), "-", cpu, 100 * cpu_total / wall,
          1e6 / cpu, 0);
    }
    for (size_t i = 0; i < c.streams.size(); ++i) {
      const int s = c.streams[i];
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // idle threads wind down
      const int64_t idle_rss = router->Status().second;
      Sampler sampler(*router);
      const double cpu0 = router->CpuMicros();
      LoadResult r = ClosedLoop(stubs, req, s, s * c.rounds);
      const double cpu_total = router->CpuMicros() - cpu0;
      const double cpu = cpu_total / static_cast<double>(r.us.size());
      sampler.Stop();
      out << absl::StrFormat(
          "  %-26s %8d %8d %8.1f KiB %8.0f us %8.0f us %11.0f %8.0f us %6.0f%% %10.0f %7d\n", label,
          s, sampler.peak_threads(), static_cast<double>(sampler.peak_rss_kb() - idle_rss) / s,
          Percentile(r.us, 0.5) - Percentile(direct[i].us, 0.5),
          Percentile(r.us, 0.99) - Percentile(direct[i].us, 0.99), r.us.size() / r.seconds, cpu,
          100 * cpu_total / (r.seconds * 1e6), 1e6 / cpu, r.failed);
      if (r.failed > 0) out << "    first failure: " << r.first_error << "\n";
      out.flush();
    }
  }
  for (size_t i = 0; i < c.streams.size(); ++i) {
    out << absl::StrFormat("  %-26s %8d %8s %11s p50 %5.0f us p99 %5.0f us %11.0f %7d\n",
                           "(direct to a worker)", c.streams[i], "-", "-",
                           Percentile(direct[i].us, 0.5), Percentile(direct[i].us, 0.99),
                           direct[i].us.size() / direct[i].seconds, direct[i].failed);
    if (direct[i].failed > 0) out << "    first failure: " << direct[i].first_error << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PinToCpus(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int n = static_cast<int>(sysconf(_SC_NPROCESSORS_CONF));
  for (int cpu : cpus) {
    if (cpu < 0 || cpu >= n || cpu >= CPU_SETSIZE) {
      return absl::InvalidArgumentError(absl::StrFormat("CPU %d: not in [0, %d)", cpu, n));
    }
    CPU_SET(cpu, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CPUs %s: sched_setaffinity failed", absl::StrJoin(cpus, ",")));
  }
  return absl::OkStatus();
}

absl::Status RunLatencyBench(const LatencyBenchConfig& c, std::ostream& out) {
  std::vector<std::unique_ptr<FakeWorker>> services;
  std::vector<std::unique_ptr<GrpcServer>> workers;
  router::RouterConfig rc;
  rc.tokenizer_path = c.tokenizer_dir;
  FakeWorkerOptions fo;
  fo.tokens_per_chunk = c.completion_tokens;
  for (int i = 0; i < c.num_workers; ++i) {
    services.push_back(std::make_unique<FakeWorker>(fo));
    ASSIGN_OR_RETURN(auto server, GrpcServer::Start(ServerOptions{}, {services.back().get()}));
    rc.workers.push_back(server->address());
    workers.push_back(std::move(server));
  }
  rl::v1::GenerateRequest ids_req;
  for (int i = 0; i < 64; ++i) ids_req.mutable_input_ids()->add_ids(1 + i);
  rl::v1::GenerateRequest text_req;
  text_req.set_text("Once upon a time there was a little girl who loved to play outside.");
  {
    ASSIGN_OR_RETURN(auto router, router::RouterServer::Start(rc));
    auto worker_stub = rl::v1::Worker::NewStub(
        grpc::CreateChannel(workers[0]->address(), grpc::InsecureChannelCredentials()));
    auto router_stub = rl::v1::Router::NewStub(
        grpc::CreateChannel(router->address(), grpc::InsecureChannelCredentials()));
    ASSIGN_OR_RETURN(std::vector<double> direct, Sequential(*worker_stub, ids_req, c.requests));
    ASSIGN_OR_RETURN(std::vector<double> routed_ids, Sequential(*router_stub, ids_req, c.requests));
    ASSIGN_OR_RETURN(std::vector<double> routed_text,
                     Sequential(*router_stub, text_req, c.requests));
    out << absl::StrFormat(
        "router latency, in-process (fast workers, %d-token completions, %d requests each)\n",
        c.completion_tokens, c.requests);
    out << absl::StrFormat("  direct to worker        p50 %7.0f us  p99 %7.0f us\n",
                           Percentile(direct, 0.5), Percentile(direct, 0.99));
    out << absl::StrFormat("  via router (ids)        p50 %7.0f us  p99 %7.0f us\n",
                           Percentile(routed_ids, 0.5), Percentile(routed_ids, 0.99));
    out << absl::StrFormat("  via router (text+cache) p50 %7.0f us  p99 %7.0f us\n",
                           Percentile(routed_text, 0.5), Percentile(routed_text, 0.99));
    out << absl::StrFormat("  added by the router     p50 %7.0f us  p99 %7.0f us (ids)\n",
                           Percentile(routed_ids, 0.5) - Percentile(direct, 0.5),
                           Percentile(routed_ids, 0.99) - Percentile(direct, 0.99));

    std::atomic<int> next{0}, failures{0};
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int t = 0; t < c.concurrency; ++t) {
      threads.emplace_back([&] {
        auto stub = rl::v1::Router::NewStub(
            grpc::CreateChannel(router->address(), grpc::InsecureChannelCredentials()));
        while (next.fetch_add(1) < c.throughput_requests) {
          if (!Call(*stub, text_req)) failures++;
        }
      });
    }
    for (auto& t : threads) t.join();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    out << absl::StrFormat(
        "  throughput via router   %.0f requests/s (%d streams, %d requests, %d failed)\n",
        c.throughput_requests / secs, c.concurrency, c.throughput_requests, failures.load());
    router->Shutdown();
  }
  if (!c.router_binaries.empty()) RETURN_IF_ERROR(SideBySide(c, rc.workers, ids_req, out));
  for (auto& w : workers) w->Shutdown();
  return absl::OkStatus();
}

}  // namespace rl::bench
