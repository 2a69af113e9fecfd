// collector_bench: how much the collector itself costs. An in-process FakeRouter answers every
// Generate at once (prompt echoed, --tokens output tokens with logprobs and version segments),
// so the figures are the collector's ceiling, not the model's. Two runs over the same
// requests:
//   bare      : --concurrency threads issue the same Generate calls and drop the answers
//               (gRPC client + the fake server: the floor any client pays);
//   collector : RunCollect end to end (prompt set parse, dispatch, conversion, shards with
//               fsync, checkpoints, final merge).
// Reported: samples/s and process CPU µs per sample of each; the collector's own overhead is
// the difference; the writer thread's CPU per sample (the serial part: conversion, shards,
// checkpoints, merge) gives the rate the collector could sustain with enough cores. Prints one
// JSON object.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>
#include <vector>

#include "common/flags.h"
#include "common/logging.h"
#include "common/server_runner.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "services/collector/collector.h"
#include "tests/testing/fake_router.h"

namespace {

double Cpu() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t samples = 20000;
  int concurrency = 64;
  int tokens = 64;
  int prompt_tokens = 32;
  int channels = 4;
  int batch = 1000;
  std::string dir = std::filesystem::temp_directory_path() / "rl_collector_bench";
  rl::FlagSet flags("collector_bench");
  flags.Int("samples", &samples, "samples to collect (rows, n=1)");
  flags.Int("concurrency", &concurrency, "requests in flight");
  flags.Int("tokens", &tokens, "output tokens per sample");
  flags.Int("prompt-tokens", &prompt_tokens, "prompt ids per row");
  flags.Int("channels", &channels, "gRPC connections");
  flags.Int("save-batch-size", &batch, "samples per shard");
  flags.String("dir", &dir, "scratch folder (emptied)");
  if (std::optional<int> rc = flags.ParseMain(argc, argv)) return *rc;
  (void)rl::InitLogging("warn");

  rl::collector::FakeRouter router(
      rl::collector::FakeRouterOptions{.num_output_tokens = tokens, .two_segments = true});
  auto server = rl::GrpcServer::Start(rl::ServerOptions{}, {&router});
  if (!server.ok()) {
    std::cerr << server.status() << "\n";
    return 1;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string prompts = dir + "/prompts.jsonl";
  {
    std::ofstream out(prompts);
    for (int64_t i = 0; i < samples; ++i) {
      out << "{\"index\":" << i << ",\"input_ids\":[";
      for (int t = 0; t < prompt_tokens; ++t) out << (t ? "," : "") << (i + t) % 1000;
      out << "],\"source\":\"bench\"}\n";
    }
  }

  // Bare client: the same calls, answers dropped.
  std::vector<std::unique_ptr<rl::v1::Router::Stub>> stubs;
  for (int c = 0; c < channels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("rl.collector.channel", c);
    stubs.push_back(rl::v1::Router::NewStub(
        grpc::CreateCustomChannel((*server)->address(), grpc::InsecureChannelCredentials(), args)));
  }
  std::atomic<int64_t> next{0};
  double t0 = Now(), c0 = Cpu();
  std::vector<std::thread> threads;
  for (int i = 0; i < concurrency; ++i) {
    threads.emplace_back([&, i] {
      while (true) {
        const int64_t k = next.fetch_add(1);
        if (k >= samples) break;
        rl::v1::GenerateRequest req;
        for (int t = 0; t < prompt_tokens; ++t) req.mutable_input_ids()->add_ids((k + t) % 1000);
        req.mutable_sampling_params()->set_max_new_tokens(tokens);
        req.set_return_logprob(true);
        req.set_return_trajectory(true);
        req.set_stream(false);
        req.set_request_id("bare-" + std::to_string(k));
        grpc::ClientContext ctx;
        auto reader = stubs[i % stubs.size()]->Generate(&ctx, req);
        rl::v1::GenerateResponse msg;
        while (reader->Read(&msg)) {
        }
        (void)reader->Finish();
      }
    });
  }
  for (auto& t : threads) t.join();
  const double bare_s = Now() - t0, bare_cpu = Cpu() - c0;

  rl::collector::CollectConfig c;
  c.router = (*server)->address();
  c.prompts = prompts;
  c.out = dir + "/out";
  c.concurrency = concurrency;
  c.save_batch_size = batch;
  c.max_new_tokens = tokens;
  c.channels = channels;
  c.progress = "off";
  t0 = Now();
  c0 = Cpu();
  auto s = rl::collector::RunCollect(c);
  const double coll_s = Now() - t0, coll_cpu = Cpu() - c0;
  if (!s.ok() || s->done != samples) {
    std::cerr << "collector_bench: " << (s.ok() ? "incomplete run" : s.status().ToString()) << "\n";
    return 1;
  }
  const double n = static_cast<double>(samples);
  nlohmann::json j = {
      {"samples", samples},
      {"concurrency", concurrency},
      {"channels", channels},
      {"output_tokens", tokens},
      {"prompt_tokens", prompt_tokens},
      {"cores", std::thread::hardware_concurrency()},
      {"bare_samples_per_s", n / bare_s},
      {"bare_cpu_us_per_sample", 1e6 * bare_cpu / n},
      {"collector_samples_per_s", n / coll_s},
      {"collector_cpu_us_per_sample", 1e6 * coll_cpu / n},
      {"collector_overhead_cpu_us_per_sample", 1e6 * (coll_cpu - bare_cpu) / n},
      {"writer_thread_cpu_us_per_sample", 1e6 * s->writer_cpu_seconds / n},
      {"writer_bound_samples_per_s", s->writer_cpu_seconds > 0 ? n / s->writer_cpu_seconds : 0},
      {"shards", s->shards},
      {"merged_bytes", std::filesystem::file_size(c.out + "/trajectories.safetensors")}};
  std::cout << j.dump() << "\n";
  (*server)->Shutdown();
  std::filesystem::remove_all(dir);
  return 0;
}
