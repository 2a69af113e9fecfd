// refit_bench: issue 30's figures in one run, per model, side by side (CPU backend; --backend
// cuda runs every worker on the one GPU).
//
//   refit_bench [--quick] [--models llama:0.5b,qwen3_moe:1b] [--rounds 3] [--activations 20]
//               [--fleet-rounds 6] [--workers 3] [--density 0.02] [--threads 1]
//
// For each model (made with a fixed seed, bf16; --quick: the tiny ones, a smoke run in seconds)
// it writes a child checkpoint where --density of every tensor's elements moved (one trainer
// step), publishes it dense (folder + manifest) and as a delta of the parent, and prints:
//   1. publication bytes and changed density, dense vs delta (target: delta <= 5% of dense);
//   2. staging on one in-process rl-worker serving the parent while a decode stream runs
//      (one request at a time, streamed token by token, ignore_eos): StageWeights time of the
//      dense and of the delta publication, and the stream's tokens/s during each stage against
//      tokens/s in an undisturbed window just before it (target: >= 70%); medians of --rounds;
//      the same rounds first on a worker whose stage reads at the engine's priority
//      (--staging-nice 0), against the default (--staging-nice 10);
//   3. the activation pause seen by the stream: the inter-token gap that spans the call, p50 /
//      p99 over --activations calls, for ActivateWeights of a staged version with keep_kv (the
//      swap), ActivateWeights default (retract: the swap plus the stream's recompute) and the
//      one-call UpdateWeightsFromDisk (keep_kv: the read off the engine thread, then the swap),
//      next to the undisturbed inter-token gap (target: the excess <= 20 ms p99, flat in size);
//      the delta's activated checksum is compared with the dense child's manifest digest;
//   4. fleet convergence: --workers in-process rl-workers behind an in-process rl-router;
//      RefitWeights (stage everywhere, then activate everywhere) and the router's
//      StageWeights + ActivateWeights timed apart (publish -> every worker active);
//   5. request version lag: requests sent through the router while the refits run, the final's
//      weight_version minus its dispatch_weight_version (versions that moved under a request).
// Timings are wall time on a shared machine: `lscpu` and `uptime` are printed with them.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/weights/train_step.h"
#include "common/flags.h"
#include "common/model_io/model_maker.h"
#include "common/model_io/safetensors.h"
#include "common/status.h"
#include "common/weight_sync/delta_file.h"
#include "common/weight_sync/manifest.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "rl/v1/admin.grpc.pb.h"
#include "rl/v1/router.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"
#include "services/router/router_server.h"
#include "services/worker/worker_server.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
  return v[std::min(i, v.size() - 1)];
}
double Median(std::vector<double> v) { return Quantile(std::move(v), 0.5); }

int64_t DirBytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") total += static_cast<int64_t>(e.file_size());
  }
  return total;
}

absl::Status Grpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", s.error_message()));
}

// A plain copy of `dir` (hard links; no manifest): a checkpoint served as "current + 1", so
// activations can alternate two contents without the version ledger's immutability rule.
absl::Status LinkPlain(const std::string& dir, const std::string& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() == "rl-manifest.json") continue;
    fs::create_hard_link(e.path(), fs::path(out) / e.path().filename(), ec);
    if (ec)
      return absl::InternalError(absl::StrCat("link ", e.path().string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

// One decode stream on a worker: requests one after the other (a short random prompt,
// `max_new_tokens` tokens, ignore_eos, streamed), every chunk's arrival recorded.
class DecodeStream {
 public:
  struct Chunk {
    Clock::time_point at;
    int request;
    int tokens;
  };

  DecodeStream(const std::string& address, int vocab, int max_new_tokens)
      : stub_(rl::v1::Worker::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
        vocab_(vocab),
        max_new_tokens_(max_new_tokens),
        thread_([this] { Loop(); }) {}
  ~DecodeStream() {
    stop_.store(true);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (ctx_ != nullptr) ctx_->TryCancel();
    }
    thread_.join();
  }

  std::vector<Chunk> Snapshot() {
    std::lock_guard<std::mutex> l(mu_);
    return chunks_;
  }
  int64_t TokensIn(Clock::time_point a, Clock::time_point b) {
    std::lock_guard<std::mutex> l(mu_);
    int64_t n = 0;
    for (const Chunk& c : chunks_) n += (c.at >= a && c.at < b) ? c.tokens : 0;
    return n;
  }
  // Waits until `n` more chunks arrived after `t` (bounded: false after 60 s).
  bool WaitChunksAfter(Clock::time_point t, int n) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> l(mu_);
        int seen = 0;
        for (auto it = chunks_.rbegin(); it != chunks_.rend() && it->at > t; ++it) ++seen;
        if (seen >= n) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }
  // The inter-chunk gap (same request) whose interval overlaps [a, b] the most: the largest
  // such gap; nullopt when the stream did not run through the window.
  std::optional<double> GapAround(Clock::time_point a, Clock::time_point b) {
    std::lock_guard<std::mutex> l(mu_);
    std::optional<double> best;
    for (size_t i = 1; i < chunks_.size(); ++i) {
      const Chunk& p = chunks_[i - 1];
      const Chunk& c = chunks_[i];
      if (p.request != c.request || c.at < a || p.at > b) continue;
      const double g = Seconds(p.at, c.at);
      if (!best || g > *best) best = g;
    }
    return best;
  }
  // Inter-chunk gaps (same request) inside [a, b].
  std::vector<double> GapsIn(Clock::time_point a, Clock::time_point b) {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<double> out;
    for (size_t i = 1; i < chunks_.size(); ++i) {
      const Chunk& p = chunks_[i - 1];
      const Chunk& c = chunks_[i];
      if (p.request == c.request && p.at >= a && c.at <= b) out.push_back(Seconds(p.at, c.at));
    }
    return out;
  }
  std::string error() {
    std::lock_guard<std::mutex> l(mu_);
    return error_;
  }

 private:
  void Loop() {
    std::mt19937 rng(11);
    for (int r = 0; !stop_.load(); ++r) {
      rl::v1::GenerateRequest req;
      req.set_request_id(absl::StrCat("stream-", r));
      for (int t = 0; t < 16; ++t) req.mutable_input_ids()->add_ids(3 + rng() % (vocab_ - 3));
      req.mutable_sampling_params()->set_max_new_tokens(max_new_tokens_);
      req.mutable_sampling_params()->set_temperature(1.0f);
      req.mutable_sampling_params()->set_seed(static_cast<uint64_t>(r));
      req.mutable_sampling_params()->set_ignore_eos(true);
      req.set_stream(true);
      auto ctx = std::make_unique<grpc::ClientContext>();
      {
        std::lock_guard<std::mutex> l(mu_);
        if (stop_.load()) return;
        ctx_ = ctx.get();
      }
      auto reader = stub_->Generate(ctx.get(), req);
      rl::v1::GenerateResponse resp;
      while (reader->Read(&resp)) {
        if (resp.has_chunk() && resp.chunk().token_ids_size() > 0) {
          std::lock_guard<std::mutex> l(mu_);
          chunks_.push_back({Clock::now(), r, resp.chunk().token_ids_size()});
        }
      }
      const grpc::Status s = reader->Finish();
      std::lock_guard<std::mutex> l(mu_);
      ctx_ = nullptr;
      if (!s.ok() && !stop_.load()) {
        error_ = s.error_message();
        return;
      }
    }
  }

  std::unique_ptr<rl::v1::Worker::Stub> stub_;
  const int vocab_;
  const int max_new_tokens_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  grpc::ClientContext* ctx_ = nullptr;  // guarded by mu_
  std::vector<Chunk> chunks_;           // guarded by mu_
  std::string error_;                   // guarded by mu_
  std::thread thread_;
};

struct Options {
  bool quick = false;
  std::string models = "llama:0.5b,qwen3_moe:1b";
  std::string fleet_models = "all";  // the models the fleet part runs on (3 workers x 2 copies)
  std::string work = "/tmp/rl_refit_bench";
  double density = 0.02;
  int rounds = 3;
  int activations = 20;
  int fleet_rounds = 6;
  int workers = 3;
  int threads = 1;
  int stream_tokens = 256;
  int lag_clients = 4;
  int staging_nice = 10;
  bool compare_nice0 = true;
  bool no_update_buffers = false;  // the single worker too (memory: one checkpoint copy less)
  std::string backend = "cpu";     // "cuda": every worker on the one GPU (staged device copies)
};

// Everything measured for one model, printed side by side at the end.
struct Figures {
  std::string model;
  int64_t params_bytes = 0;
  double changed_pct = 0;
  int64_t dense_bytes = 0, delta_bytes = 0;
  double stage_dense_s = 0, stage_delta_s = 0;
  double tps_undisturbed = 0, tps_dense = 0, tps_delta = 0;
  // The same staging rounds on a worker with --staging-nice 0 (the read at the engine's
  // priority), before the main worker: ratios of undisturbed, and stage times.
  double nice0_dense_pct = -1, nice0_delta_pct = -1, nice0_stage_dense_s = 0,
         nice0_stage_delta_s = 0;
  double gap_p50_ms = 0;  // undisturbed inter-token gap
  double gap_p99_ms = 0;
  std::vector<double> act_keep_ms, act_retract_ms, one_call_ms;  // gaps around the call
  std::vector<double> act_keep_call_ms;                          // the ActivateWeights call
  bool delta_checksum_equal = false;
  std::vector<double> refit_s, fleet_stage_s, fleet_activate_s;
  std::vector<double> lag;  // versions per request
  int lag_requests = 0;
};

class Bench {
 public:
  Bench(Options o) : o_(std::move(o)) {}

  absl::Status RunModel(const std::string& arch, const std::string& size, uint64_t seed,
                        Figures* f) {
    const std::string dir = absl::StrCat(o_.work, "/", arch, "-", size);
    const std::string parent = dir + "/parent", child = dir + "/child", delta = dir + "/delta";
    const std::string plain_parent = dir + "/plain-parent", plain_child = dir + "/plain-child";
    f->model = absl::StrCat(arch, " ", size);
    auto t = Clock::now();
    rl::model_io::MakeModelOptions m;
    m.arch = arch;
    m.size = size;
    m.seed = seed;
    m.dtype = "bfloat16";
    m.out_dir = parent;
    RETURN_IF_ERROR(rl::model_io::MakeModel(m));
    RETURN_IF_ERROR(rl::bench::WriteStep(parent, child, o_.density, 7));
    ASSIGN_OR_RETURN(rl::model_io::Checkpoint child_ckpt, rl::model_io::OpenCheckpoint(child));
    const rl::weight_sync::Manifest manifest =
        rl::weight_sync::ManifestOfCheckpoint(child_ckpt, 1, 0);
    RETURN_IF_ERROR(rl::weight_sync::WriteManifest(child, manifest));
    ASSIGN_OR_RETURN(auto stats,
                     rl::weight_sync::WriteDeltaPublication(parent, child, delta, 1, 0));
    RETURN_IF_ERROR(LinkPlain(parent, plain_parent));
    RETURN_IF_ERROR(LinkPlain(child, plain_child));
    ASSIGN_OR_RETURN(rl::model_io::ModelConfig config, rl::model_io::LoadModelConfig(parent));
    f->dense_bytes = DirBytes(child);
    f->delta_bytes = stats.delta_bytes;
    f->changed_pct = 100.0 * static_cast<double>(stats.changed_elements) /
                     static_cast<double>(stats.num_elements);
    absl::PrintF("[%s] made parent + child + publications in %.1f s (%d bytes, %.2f%% changed)\n",
                 f->model, Seconds(t, Clock::now()), f->dense_bytes, f->changed_pct);

    if (o_.compare_nice0 && o_.staging_nice != 0) {
      Figures n0;
      n0.model = f->model;
      RETURN_IF_ERROR(OneWorker(config, parent, child, delta, plain_parent, plain_child, manifest,
                                &n0, /*staging_nice=*/0, /*staging_only=*/true));
      f->nice0_dense_pct = 100 * n0.tps_dense / n0.tps_undisturbed;
      f->nice0_delta_pct = 100 * n0.tps_delta / n0.tps_undisturbed;
      f->nice0_stage_dense_s = n0.stage_dense_s;
      f->nice0_stage_delta_s = n0.stage_delta_s;
    }
    RETURN_IF_ERROR(OneWorker(config, parent, child, delta, plain_parent, plain_child, manifest, f,
                              o_.staging_nice, /*staging_only=*/false));
    if (o_.fleet_models == "all" || absl::StrContains(absl::StrCat(",", o_.fleet_models, ","),
                                                      absl::StrCat(",", arch, ":", size, ","))) {
      RETURN_IF_ERROR(Fleet(parent, plain_parent, plain_child, config, f));
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
    return absl::OkStatus();
  }

 private:
  rl::worker::WorkerConfig WorkerConfigFor(const std::string& model) const {
    rl::worker::WorkerConfig c;
    c.model_path = model;
    c.port = 0;
    c.backend = o_.backend;
    c.kv_cache_gb = 0.25;  // ~1,100 tokens of the 0.5B: a 256-token stream, 4 lag clients
    c.num_threads = o_.threads;
    return c;
  }

  absl::Status OneWorker(const rl::model_io::ModelConfig& config, const std::string& parent,
                         const std::string& child, const std::string& delta,
                         const std::string& plain_parent, const std::string& plain_child,
                         const rl::weight_sync::Manifest& manifest, Figures* f, int staging_nice,
                         bool staging_only) {
    rl::worker::WorkerConfig wc = WorkerConfigFor(parent);
    wc.staging_nice = staging_nice;
    wc.no_update_buffers = o_.no_update_buffers;
    ASSIGN_OR_RETURN(auto server, rl::worker::WorkerServer::Start(wc));
    auto admin = rl::v1::Admin::NewStub(
        grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials()));
    absl::Status result = [&]() -> absl::Status {
      DecodeStream stream(server->address(), static_cast<int>(config.vocab_size), o_.stream_tokens);
      if (!stream.WaitChunksAfter(Clock::now(), 8)) {
        return absl::InternalError(absl::StrCat("decode stream: ", stream.error()));
      }
      // 2. Staging while decoding, against an undisturbed window of the same length before.
      std::vector<double> dense_s, delta_s, tps_dense, tps_delta, tps_quiet, quiet_gaps;
      for (int r = 0; r < o_.rounds; ++r) {
        for (int which = 0; which < 2; ++which) {
          const bool use_delta = (r + which) % 2 == 0;
          const double window = std::max(0.5, Median(use_delta ? delta_s : dense_s));
          const auto q0 = Clock::now();
          std::this_thread::sleep_for(std::chrono::duration<double>(window));
          const auto q1 = Clock::now();
          tps_quiet.push_back(static_cast<double>(stream.TokensIn(q0, q1)) / Seconds(q0, q1));
          for (double g : stream.GapsIn(q0, q1)) quiet_gaps.push_back(g);
          rl::v1::StageWeightsRequest req;
          req.set_model_path(use_delta ? delta : child);
          rl::v1::AdminResponse resp;
          grpc::ClientContext ctx;
          const auto s0 = Clock::now();
          RETURN_IF_ERROR(Grpc(admin->StageWeights(&ctx, req, &resp), "stage"));
          const auto s1 = Clock::now();
          (use_delta ? delta_s : dense_s).push_back(Seconds(s0, s1));
          if (use_delta && r == o_.rounds - 1) {
            // Its phases: the copy of the served weights and what of it the engine thread held.
            absl::PrintF("[%s] nice %d, delta stage: %s\n", f->model, staging_nice, resp.message());
          }
          (use_delta ? tps_delta : tps_dense)
              .push_back(static_cast<double>(stream.TokensIn(s0, s1)) / Seconds(s0, s1));
          grpc::ClientContext dctx;
          RETURN_IF_ERROR(Grpc(admin->DropStagedWeights(&dctx, {}, &resp), "drop"));
        }
      }
      f->stage_dense_s = Median(dense_s);
      f->stage_delta_s = Median(delta_s);
      f->tps_undisturbed = Median(tps_quiet);
      f->tps_dense = Median(tps_dense);
      f->tps_delta = Median(tps_delta);
      f->gap_p50_ms = Quantile(quiet_gaps, 0.5) * 1e3;
      f->gap_p99_ms = Quantile(quiet_gaps, 0.99) * 1e3;
      if (staging_only) return absl::OkStatus();

      // The delta, activated once: its checksum must be the dense child's.
      {
        rl::v1::StageWeightsRequest req;
        req.set_model_path(delta);
        rl::v1::AdminResponse resp;
        grpc::ClientContext ctx;
        RETURN_IF_ERROR(Grpc(admin->StageWeights(&ctx, req, &resp), "stage delta"));
        rl::v1::ActivateWeightsRequest areq;
        areq.set_keep_kv(true);
        grpc::ClientContext actx;
        RETURN_IF_ERROR(Grpc(admin->ActivateWeights(&actx, areq, &resp), "activate delta"));
        rl::v1::WeightsCheckerRequest creq;
        creq.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
        rl::v1::WeightsCheckerResponse cresp;
        grpc::ClientContext cctx;
        RETURN_IF_ERROR(Grpc(admin->WeightsChecker(&cctx, creq, &cresp), "checksum"));
        f->delta_checksum_equal = cresp.rank_sha256() == manifest.sha256;
      }

      // 3. Activation pauses, alternating two plain contents (each served as current + 1).
      for (int i = 0; i < 3 * o_.activations; ++i) {
        const int mode = i % 3;  // 0: activate keep_kv, 1: activate retract, 2: one call
        const std::string& folder = i % 2 == 0 ? plain_parent : plain_child;
        rl::v1::AdminResponse resp;
        if (mode != 2) {
          rl::v1::StageWeightsRequest req;
          req.set_model_path(folder);
          grpc::ClientContext ctx;
          RETURN_IF_ERROR(Grpc(admin->StageWeights(&ctx, req, &resp), "stage"));
        }
        if (!stream.WaitChunksAfter(Clock::now(), 3)) {
          return absl::InternalError(absl::StrCat("decode stream: ", stream.error()));
        }
        grpc::ClientContext ctx;
        const auto a0 = Clock::now();
        if (mode == 2) {
          rl::v1::UpdateWeightsFromDiskRequest req;
          req.set_model_path(folder);
          req.set_keep_kv(true);
          RETURN_IF_ERROR(Grpc(admin->UpdateWeightsFromDisk(&ctx, req, &resp), "update"));
        } else {
          rl::v1::ActivateWeightsRequest req;
          req.set_keep_kv(mode == 0);
          RETURN_IF_ERROR(Grpc(admin->ActivateWeights(&ctx, req, &resp), "activate"));
        }
        const auto a1 = Clock::now();
        if (!stream.WaitChunksAfter(a1, 2)) {
          return absl::InternalError(absl::StrCat("decode stream: ", stream.error()));
        }
        if (mode == 0) f->act_keep_call_ms.push_back(Seconds(a0, a1) * 1e3);
        if (std::optional<double> g = stream.GapAround(a0, a1)) {
          (mode == 0   ? f->act_keep_ms
           : mode == 1 ? f->act_retract_ms
                       : f->one_call_ms)
              .push_back(*g * 1e3);
        }
      }
      return absl::OkStatus();
    }();
    server->Shutdown();
    return result;
  }

  absl::Status Fleet(const std::string& parent, const std::string& plain_parent,
                     const std::string& plain_child, const rl::model_io::ModelConfig& config,
                     Figures* f) {
    std::vector<std::unique_ptr<rl::worker::WorkerServer>> workers;
    rl::router::RouterConfig rc;
    for (int i = 0; i < o_.workers; ++i) {
      // No spare read buffers (a copy of the checkpoint each): N workers in one process.
      rl::worker::WorkerConfig wc = WorkerConfigFor(parent);
      wc.no_update_buffers = true;
      ASSIGN_OR_RETURN(auto w, rl::worker::WorkerServer::Start(wc));
      rc.workers.push_back(w->address());
      workers.push_back(std::move(w));
    }
    rc.tokenizer_path = parent;
    rc.health_interval_ms = 100;
    rc.retry_backoff_ms = 10;
    absl::StatusOr<std::unique_ptr<rl::router::RouterServer>> router =
        rl::router::RouterServer::Start(rc);
    auto shutdown = [&] {
      if (router.ok()) (*router)->Shutdown();
      for (auto& w : workers) w->Shutdown();
    };
    if (!router.ok()) {
      shutdown();
      return router.status();
    }
    auto channel = grpc::CreateChannel((*router)->address(), grpc::InsecureChannelCredentials());
    auto admin = rl::v1::Admin::NewStub(channel);
    auto gen = rl::v1::Router::NewStub(channel);
    // Wait until the router sees every worker healthy.
    for (int i = 0; i < 100; ++i) {
      rl::v1::GetServerInfoResponse info;
      grpc::ClientContext ctx;
      if (admin->GetServerInfo(&ctx, {}, &info).ok() && info.workers_size() == o_.workers) {
        bool all = true;
        for (const auto& w : info.workers()) all = all && w.error().empty();
        if (all) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // Version-lag clients: requests through the router while the refits run.
    std::atomic<bool> stop{false};
    std::mutex lag_mu;
    std::vector<double> lag;
    std::string lag_error;
    std::vector<std::thread> clients;
    for (int c = 0; c < o_.lag_clients; ++c) {
      clients.emplace_back([&, c] {
        std::mt19937 rng(100 + c);
        for (int r = 0; !stop.load(); ++r) {
          rl::v1::GenerateRequest req;
          req.set_request_id(absl::StrCat("lag-", c, "-", r));
          for (int t = 0; t < 16; ++t) {
            req.mutable_input_ids()->add_ids(3 + static_cast<int>(rng() % (config.vocab_size - 3)));
          }
          req.mutable_sampling_params()->set_max_new_tokens(o_.quick ? 16 : 64);
          req.mutable_sampling_params()->set_temperature(1.0f);
          req.mutable_sampling_params()->set_ignore_eos(true);
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
          auto reader = gen->Generate(&ctx, req);
          rl::v1::GenerateResponse resp;
          std::optional<rl::v1::GenerateFinal> fin;
          while (reader->Read(&resp)) {
            if (resp.has_final()) fin = resp.final();
          }
          const grpc::Status s = reader->Finish();
          std::lock_guard<std::mutex> l(lag_mu);
          if (s.ok() && fin.has_value()) {
            lag.push_back(
                static_cast<double>(fin->weight_version() - fin->dispatch_weight_version()));
          } else if (!s.ok() && lag_error.empty()) {
            lag_error = s.error_message();
          }
        }
      });
    }
    absl::Status result = [&]() -> absl::Status {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      for (int r = 0; r < o_.fleet_rounds; ++r) {
        const std::string& folder = r % 2 == 0 ? plain_child : plain_parent;
        rl::v1::AdminResponse resp;
        if (r % 2 == 0) {
          rl::v1::RefitWeightsRequest req;
          req.set_model_path(folder);
          grpc::ClientContext ctx;
          const auto t0 = Clock::now();
          RETURN_IF_ERROR(Grpc(admin->RefitWeights(&ctx, req, &resp), "refit"));
          if (!resp.success()) return absl::InternalError(absl::StrCat("refit: ", resp.message()));
          f->refit_s.push_back(Seconds(t0, Clock::now()));
        } else {
          rl::v1::StageWeightsRequest sreq;
          sreq.set_model_path(folder);
          grpc::ClientContext sctx;
          const auto t0 = Clock::now();
          RETURN_IF_ERROR(Grpc(admin->StageWeights(&sctx, sreq, &resp), "fleet stage"));
          if (!resp.success()) return absl::InternalError(absl::StrCat("stage: ", resp.message()));
          const auto t1 = Clock::now();
          grpc::ClientContext actx;
          RETURN_IF_ERROR(Grpc(admin->ActivateWeights(&actx, {}, &resp), "fleet activate"));
          if (!resp.success()) {
            return absl::InternalError(absl::StrCat("activate: ", resp.message()));
          }
          f->fleet_stage_s.push_back(Seconds(t0, t1));
          f->fleet_activate_s.push_back(Seconds(t1, Clock::now()));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(o_.quick ? 100 : 500));
      }
      return absl::OkStatus();
    }();
    stop.store(true);
    for (auto& t : clients) t.join();
    shutdown();
    f->lag = lag;
    f->lag_requests = static_cast<int>(lag.size());
    if (result.ok() && lag.empty()) {
      return absl::InternalError(
          absl::StrCat("no request finished through the refits: ", lag_error));
    }
    return result;
  }

  Options o_;
};

void Print(const std::vector<Figures>& all) {
  auto row = [&](const char* label, auto fn) {
    absl::PrintF("%-46s", label);
    for (const Figures& f : all) absl::PrintF(" %22s", fn(f));
    absl::PrintF("\n");
  };
  auto ms = [](const std::vector<double>& v) {
    return absl::StrFormat("%.1f / %.1f", Quantile(v, 0.5), Quantile(v, 0.99));
  };
  row("", [](const Figures& f) { return f.model; });
  row("publication: dense bytes", [](const Figures& f) { return absl::StrCat(f.dense_bytes); });
  row("publication: delta bytes (% of dense)", [](const Figures& f) {
    return absl::StrFormat("%d (%.2f%%)", f.delta_bytes,
                           100.0 * static_cast<double>(f.delta_bytes) / f.dense_bytes);
  });
  row("changed elements",
      [](const Figures& f) { return absl::StrFormat("%.2f%%", f.changed_pct); });
  row("stage time s: dense / delta", [](const Figures& f) {
    return absl::StrFormat("%.2f / %.2f", f.stage_dense_s, f.stage_delta_s);
  });
  row("decode tok/s undisturbed",
      [](const Figures& f) { return absl::StrFormat("%.1f", f.tps_undisturbed); });
  row("decode tok/s while staging: dense / delta",
      [](const Figures& f) { return absl::StrFormat("%.1f / %.1f", f.tps_dense, f.tps_delta); });
  row("  = % of undisturbed (target >= 70%)", [](const Figures& f) {
    return absl::StrFormat("%.0f%% / %.0f%%", 100 * f.tps_dense / f.tps_undisturbed,
                           100 * f.tps_delta / f.tps_undisturbed);
  });
  row("  with --staging-nice 0 (same priority)", [](const Figures& f) {
    if (f.nice0_dense_pct < 0) return std::string("-");
    return absl::StrFormat("%.0f%% / %.0f%%", f.nice0_dense_pct, f.nice0_delta_pct);
  });
  row("  stage time s with --staging-nice 0", [](const Figures& f) {
    if (f.nice0_dense_pct < 0) return std::string("-");
    return absl::StrFormat("%.2f / %.2f", f.nice0_stage_dense_s, f.nice0_stage_delta_s);
  });
  row("inter-token gap ms undisturbed p50 / p99",
      [](const Figures& f) { return absl::StrFormat("%.1f / %.1f", f.gap_p50_ms, f.gap_p99_ms); });
  row("gap around ActivateWeights keep_kv p50/p99",
      [&](const Figures& f) { return ms(f.act_keep_ms); });
  row("  excess over undisturbed p50 (target p99<=20)", [](const Figures& f) {
    std::vector<double> ex;
    for (double g : f.act_keep_ms) ex.push_back(g - f.gap_p50_ms);
    return absl::StrFormat("%.1f / %.1f", Quantile(ex, 0.5), Quantile(ex, 0.99));
  });
  row("  ActivateWeights call ms p50 / p99",
      [&](const Figures& f) { return ms(f.act_keep_call_ms); });
  row("gap around ActivateWeights retract p50/p99",
      [&](const Figures& f) { return ms(f.act_retract_ms); });
  row("gap around one-call disk update p50/p99",
      [&](const Figures& f) { return ms(f.one_call_ms); });
  row("activations measured per mode", [](const Figures& f) {
    return absl::StrFormat("%d/%d/%d", f.act_keep_ms.size(), f.act_retract_ms.size(),
                           f.one_call_ms.size());
  });
  row("delta activated == dense child checksum",
      [](const Figures& f) { return std::string(f.delta_checksum_equal ? "yes" : "NO"); });
  row("fleet RefitWeights s (publish->all active)", [](const Figures& f) {
    if (f.refit_s.empty()) return std::string("not run (--fleet-models)");
    return absl::StrFormat("%.2f (n=%d)", Median(f.refit_s), f.refit_s.size());
  });
  row("fleet stage s / activate s (router fan-out)", [](const Figures& f) {
    if (f.fleet_stage_s.empty()) return std::string("-");
    return absl::StrFormat("%.2f / %.3f", Median(f.fleet_stage_s), Median(f.fleet_activate_s));
  });
  row("request version lag p50 / p99 / max", [](const Figures& f) {
    if (f.lag.empty()) return std::string("-");
    return absl::StrFormat("%.0f / %.0f / %.0f (n=%d)", Quantile(f.lag, 0.5), Quantile(f.lag, 0.99),
                           Quantile(f.lag, 1.0), f.lag_requests);
  });
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  rl::FlagSet flags("refit_bench");
  flags.Bool("quick", &o.quick, "the tiny models, few rounds: a smoke run under a minute");
  flags.String("models", &o.models, "ARCH:SIZE,... made with fixed seeds in bf16");
  flags.String("work", &o.work, "scratch folder (removed at the end)");
  flags.String("fleet-models", &o.fleet_models,
               "ARCH:SIZE,... the fleet part runs on ('all'; each worker holds two copies while "
               "staging)");
  flags.Double("density", &o.density, "fraction of elements changed per tensor");
  flags.Int("rounds", &o.rounds, "staging rounds per source (medians)");
  flags.Int("activations", &o.activations, "activations per pause mode");
  flags.Int("fleet-rounds", &o.fleet_rounds,
            "fleet refits (half RefitWeights, half stage+activate)");
  flags.Int("workers", &o.workers, "workers behind the router");
  flags.Int("threads", &o.threads, "CPU threads per worker");
  flags.Int("stream-tokens", &o.stream_tokens, "tokens per decode-stream request");
  flags.Int("lag-clients", &o.lag_clients, "concurrent requests through the router");
  flags.Int("staging-nice", &o.staging_nice, "the workers' --staging-nice");
  flags.Bool("no-update-buffers", &o.no_update_buffers,
             "the single worker without spare read buffers (--no-reserve-update-buffers)");
  flags.Bool("compare-nice0", &o.compare_nice0,
             "also run the staging rounds on a worker with --staging-nice 0, before");
  flags.String("backend", &o.backend,
               "cpu, or cuda: the workers on GPU 0 (a staged version goes to a second device copy "
               "when it fits, else host memory; each worker holds its own copies)");
  if (std::optional<int> exit = flags.ParseMain(argc, argv)) return *exit;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a log at once (a run may be cut)
  if (o.quick) {
    if (o.models == "llama:0.5b,qwen3_moe:1b") o.models = "llama:tiny,qwen3_moe:tiny";
    o.rounds = std::min(o.rounds, 1);
    o.activations = std::min(o.activations, 4);
    o.fleet_rounds = std::min(o.fleet_rounds, 2);
    o.stream_tokens = std::min(o.stream_tokens, 64);
  }
  if (o.density <= 0 || o.density > 1 || o.rounds < 1 || o.activations < 1 || o.fleet_rounds < 1 ||
      o.workers < 1 || o.threads < 0 || o.stream_tokens < 8 || o.lag_clients < 1 ||
      o.staging_nice < 0 || o.staging_nice > 19 || (o.backend != "cpu" && o.backend != "cuda")) {
    std::fprintf(stderr, "refit_bench: a flag is out of range (see --help)\n");
    return 2;
  }
  std::fflush(stdout);
  (void)std::system("lscpu | grep 'Model name'; nproc; uptime");
  if (o.backend == "cuda") {
    (void)std::system(
        "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader");
  }
  std::error_code ec;
  fs::remove_all(o.work, ec);
  fs::create_directories(o.work);
  Bench bench(o);
  std::vector<Figures> all;
  uint64_t seed = 1;
  for (absl::string_view spec : absl::StrSplit(o.models, ',')) {
    std::pair<std::string, std::string> as = absl::StrSplit(spec, ':');
    Figures f;
    if (absl::Status s = bench.RunModel(as.first, as.second, seed++, &f); !s.ok()) {
      std::fprintf(stderr, "refit_bench: %s: %s\n", std::string(spec).c_str(),
                   s.ToString().c_str());
      fs::remove_all(o.work, ec);
      return 1;
    }
    all.push_back(std::move(f));
    std::fflush(stdout);
    (void)std::system("uptime");
    Print(all);  // after each model: a run cut later keeps what it measured
  }
  fs::remove_all(o.work, ec);
  for (const Figures& f : all) {
    if (!f.delta_checksum_equal) return 1;
  }
  return 0;
}
