// publication_bench: dense vs delta publications of one trainer step (issue 30).
//
// Makes the 0.5B llama of `rlctl make-model --arch llama --size 0.5b --seed 1` (bf16, ~1 GB; or
// uses --model), writes a child checkpoint where --density (2%) of every tensor's elements moved
// by a small step (a trainer update), publishes the child both ways (dense folder + manifest;
// delta of the parent), and prints in one run:
//   - publication bytes: dense safetensors vs the delta file, the changed density, the tensors
//     per encoding (target: delta <= 5% of dense at 2% changed elements);
//   - writing time of each publication (manifest hashing; delta encoding + manifest);
//   - staging time on an in-process rl-worker (CPU runner) that serves the parent: StageWeights
//     of the dense folder vs of the delta folder (both verified against the manifest), medians
//     of --rounds rounds each, alternating, every stage dropped after it;
//   - one ActivateWeights of the staged delta, then the worker's checksum compared with the
//     dense child's manifest digest (must be equal).
// Timings are wall time on a shared machine: print `lscpu` and `uptime` next to them.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
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
#include "services/worker/worker_server.h"

namespace {

using Clock = std::chrono::steady_clock;
using rl::model_io::DType;

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU seconds of the whole process (all threads): less inflated than wall time by other load.
double CpuSeconds() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int64_t DirBytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") total += static_cast<int64_t>(e.file_size());
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  std::string work = "/tmp/rl_publication_bench";
  double density = 0.02;
  int rounds = 3;
  rl::FlagSet flags("publication_bench");
  flags.String("model", &model, "parent checkpoint (default: make the 0.5B llama, seed 1)");
  flags.String("work", &work, "scratch folder (removed at the end)");
  flags.Double("density", &density, "fraction of elements changed per tensor");
  flags.Int("rounds", &rounds, "staging rounds per source");
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) {
    std::cerr << parsed.status() << "\n";
    return 2;
  }
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work);
  if (model.empty()) {
    model = work + "/parent";
    rl::model_io::MakeModelOptions m;
    m.arch = "llama";
    m.size = "0.5b";
    m.seed = 1;
    m.out_dir = model;
    const auto t = Clock::now();
    if (absl::Status s = rl::model_io::MakeModel(m); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
    absl::PrintF("made llama 0.5b (seed 1) in %.1f s\n", Seconds(t));
  }
  const std::string child = work + "/child";
  const std::string delta = work + "/delta";
  auto fail = [&](const absl::Status& s) {
    std::cerr << s << "\n";
    std::filesystem::remove_all(work);
    return 1;
  };
  if (absl::Status s = rl::bench::WriteStep(model, child, density, 7); !s.ok()) return fail(s);

  // Publish: the parent as version 0, the child dense (manifest) as version 1, and as a delta.
  auto t = Clock::now();
  auto child_ckpt = rl::model_io::OpenCheckpoint(child);
  if (!child_ckpt.ok()) return fail(child_ckpt.status());
  const rl::weight_sync::Manifest child_manifest =
      rl::weight_sync::ManifestOfCheckpoint(*child_ckpt, 1, 0);
  if (absl::Status s = rl::weight_sync::WriteManifest(child, child_manifest); !s.ok()) {
    return fail(s);
  }
  const double dense_write_s = Seconds(t);
  t = Clock::now();
  auto stats = rl::weight_sync::WriteDeltaPublication(model, child, delta, 1, 0);
  if (!stats.ok()) return fail(stats.status());
  const double delta_write_s = Seconds(t);
  const int64_t dense_bytes = DirBytes(child);
  absl::PrintF(
      "publication of one step, %.2f%% of %d elements changed (%d overwrite / %d xor "
      "tensors):\n",
      100.0 * static_cast<double>(stats->changed_elements) /
          static_cast<double>(stats->num_elements),
      stats->num_elements, stats->num_overwrite, stats->num_xor);
  absl::PrintF("  dense  %12d bytes (safetensors)   manifest written in %.2f s\n", dense_bytes,
               dense_write_s);
  absl::PrintF("  delta  %12d bytes = %.2f%% of dense   written in %.2f s (encode + manifest)\n",
               stats->delta_bytes,
               100.0 * static_cast<double>(stats->delta_bytes) / static_cast<double>(dense_bytes),
               delta_write_s);

  // Staging on a worker that serves the parent.
  rl::worker::WorkerConfig config;
  config.model_path = model;
  config.port = 0;
  config.backend = "cpu";
  config.kv_cache_gb = 0.05;
  config.num_threads = 1;
  auto server = rl::worker::WorkerServer::Start(config);
  if (!server.ok()) return fail(server.status());
  auto admin = rl::v1::Admin::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  auto call_status = [](const grpc::Status& s) {
    return s.ok() ? absl::OkStatus() : absl::InternalError(s.error_message());
  };
  std::vector<double> dense_s, delta_s, dense_cpu, delta_cpu;
  for (int r = 0; r < rounds; ++r) {
    for (int which = 0; which < 2; ++which) {
      const bool use_delta = (r + which) % 2 == 0;
      rl::v1::StageWeightsRequest req;
      req.set_model_path(use_delta ? delta : child);
      rl::v1::AdminResponse resp;
      grpc::ClientContext ctx;
      const auto start = Clock::now();
      const double cpu0 = CpuSeconds();
      grpc::Status s = admin->StageWeights(&ctx, req, &resp);
      const double secs = Seconds(start);
      (use_delta ? delta_cpu : dense_cpu).push_back(CpuSeconds() - cpu0);
      if (!s.ok()) return fail(call_status(s));
      (use_delta ? delta_s : dense_s).push_back(secs);
      if (r == 0) absl::PrintF("  %s\n", resp.message());
      grpc::ClientContext drop_ctx;
      if (!admin->DropStagedWeights(&drop_ctx, {}, &resp).ok())
        return fail(absl::InternalError("drop"));
    }
  }
  absl::PrintF("staging on a worker serving the parent (CPU runner, verified; median of %d):\n",
               rounds);
  absl::PrintF("  dense  %.2f s wall, %.2f s process CPU   (read %d bytes + hash)\n",
               Median(dense_s), Median(dense_cpu), dense_bytes);
  absl::PrintF("  delta  %.2f s wall, %.2f s process CPU   (copy + apply + hash)\n",
               Median(delta_s), Median(delta_cpu));
  // Activate the delta: the checksum must equal the dense child's manifest digest.
  {
    rl::v1::StageWeightsRequest req;
    req.set_model_path(delta);
    rl::v1::AdminResponse resp;
    grpc::ClientContext ctx;
    if (grpc::Status s = admin->StageWeights(&ctx, req, &resp); !s.ok()) {
      return fail(call_status(s));
    }
    grpc::ClientContext actx;
    const auto start = Clock::now();
    if (grpc::Status s = admin->ActivateWeights(&actx, {}, &resp); !s.ok()) {
      return fail(call_status(s));
    }
    const double activate_s = Seconds(start);
    rl::v1::WeightsCheckerRequest creq;
    creq.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
    rl::v1::WeightsCheckerResponse cresp;
    grpc::ClientContext cctx;
    if (!admin->WeightsChecker(&cctx, creq, &cresp).ok()) return fail(absl::InternalError("sum"));
    const bool equal = cresp.rank_sha256() == child_manifest.sha256;
    absl::PrintF("activate of the staged delta: %.3f s; checksum %s the dense child's (%s)\n",
                 activate_s, equal ? "equals" : "DIFFERS FROM",
                 child_manifest.sha256.substr(0, 16));
    (*server)->Shutdown();
    std::filesystem::remove_all(work);
    return equal ? 0 : 1;
  }
}
