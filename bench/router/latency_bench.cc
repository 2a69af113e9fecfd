#include "bench/router/latency_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/server_runner.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "rl/v1/router.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"
#include "services/router/router_server.h"

namespace rl::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Answers Generate with one chunk and a final message of `n` fixed tokens, at once.
class FastWorker final : public rl::v1::Worker::CallbackService {
 public:
  explicit FastWorker(int n) : n_(n) {}

  grpc::ServerWriteReactor<rl::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext*, const rl::v1::GenerateRequest* req) override {
    class Reactor final : public grpc::ServerWriteReactor<rl::v1::GenerateResponse> {
     public:
      Reactor(int n, const rl::v1::GenerateRequest& req) {
        chunk_.set_request_id(req.request_id());
        final_.set_request_id(req.request_id());
        rl::v1::GenerateFinal* f = final_.mutable_final();
        for (int i = 0; i < n; ++i) {
          const int32_t id = 300 + i % 100;
          chunk_.mutable_chunk()->add_token_ids(id);
          f->add_output_ids(id);
          rl::v1::TokenLogprob* lp = f->add_output_logprobs();
          lp->set_token_id(id);
          lp->set_logprob(-0.5f);
          *chunk_.mutable_chunk()->add_logprobs() = *lp;
        }
        f->set_finish_reason(rl::v1::FINISH_REASON_LENGTH);
        f->set_prompt_tokens(req.input_ids().ids_size());
        f->set_completion_tokens(n);
        StartWrite(&chunk_);
      }
      void OnWriteDone(bool ok) override {
        if (ok && !sent_final_) {
          sent_final_ = true;
          StartWriteAndFinish(&final_, grpc::WriteOptions(), grpc::Status::OK);
        } else if (!ok) {
          Finish(grpc::Status::CANCELLED);
        }
      }
      void OnDone() override { delete this; }

     private:
      rl::v1::GenerateResponse chunk_, final_;
      bool sent_final_ = false;
    };
    return new Reactor(n_, *req);
  }

  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* ctx, const rl::v1::GetLoadRequest*,
                                    rl::v1::GetLoadResponse*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

 private:
  const int n_;
};

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
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace

absl::Status RunLatencyBench(const LatencyBenchConfig& c, std::ostream& out) {
  std::vector<std::unique_ptr<FastWorker>> services;
  std::vector<std::unique_ptr<GrpcServer>> workers;
  router::RouterConfig rc;
  rc.tokenizer_path = c.tokenizer_dir;
  for (int i = 0; i < c.num_workers; ++i) {
    services.push_back(std::make_unique<FastWorker>(c.completion_tokens));
    ASSIGN_OR_RETURN(auto server, GrpcServer::Start(ServerOptions{}, {services.back().get()}));
    rc.workers.push_back(server->address());
    workers.push_back(std::move(server));
  }
  ASSIGN_OR_RETURN(auto router, router::RouterServer::Start(rc));
  auto worker_stub = rl::v1::Worker::NewStub(
      grpc::CreateChannel(workers[0]->address(), grpc::InsecureChannelCredentials()));
  auto router_stub = rl::v1::Router::NewStub(
      grpc::CreateChannel(router->address(), grpc::InsecureChannelCredentials()));

  rl::v1::GenerateRequest ids_req;
  for (int i = 0; i < 64; ++i) ids_req.mutable_input_ids()->add_ids(1 + i);
  rl::v1::GenerateRequest text_req;
  text_req.set_text("Once upon a time there was a little girl who loved to play outside.");

  auto measure = [&](auto& stub, const rl::v1::GenerateRequest& req, std::vector<double>* us) {
    for (int i = 0; i < 50; ++i) Call(stub, req);  // warm-up
    for (int i = 0; i < c.requests; ++i) {
      const auto t0 = Clock::now();
      if (!Call(stub, req)) return absl::InternalError("a Generate call failed");
      us->push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    return absl::OkStatus();
  };
  std::vector<double> direct, routed_ids, routed_text;
  RETURN_IF_ERROR(measure(*worker_stub, ids_req, &direct));
  RETURN_IF_ERROR(measure(*router_stub, ids_req, &routed_ids));
  RETURN_IF_ERROR(measure(*router_stub, text_req, &routed_text));
  out << absl::StrFormat("router latency (fast workers, %d-token completions, %d requests each)\n",
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
  out << absl::StrFormat("  throughput via router   %.0f requests/s (%d streams, %d requests, %d failed)\n",
                         c.throughput_requests / secs, c.concurrency, c.throughput_requests,
                         failures.load());
  router->Shutdown();
  for (auto& w : workers) w->Shutdown();
  return absl::OkStatus();
}

}  // namespace rl::bench
