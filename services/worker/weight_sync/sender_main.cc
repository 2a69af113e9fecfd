// rl-weight-sender: the trainer side (rank 0) of a weight-sync group for tests and for
// trainers without PyTorch. Opens a safetensors checkpoint, plans buckets, listens, waits for
// the workers to join (InitWeightsUpdateGroup), then per bucket prints one JSON line on stdout
// (the metadata the trainer passes to UpdateWeightsFromDistributed) and broadcasts it.
//
// stdout (flushed line by line, machine-readable): `listening on HOST:PORT`, then one
// BucketJson line per bucket (bucket_plan.h), then {"done": true, ...} with totals.
// --plan-only prints only the bucket lines. Logs go to stderr. Exit 0 on success, 1 on a
// failed sync, 2 on bad flags.
//
// --delta sends the folder's weights.rldelta (a delta publication, `rlctl publish-delta`)
// instead of its checkpoint (issue 30): every changed tensor as its delta payload, U8 bytes on
// the wire; the bucket lines list each tensor's own dtype and shape with its encoding, count and
// payload bytes, and the delta's parent_version, which is what `rlctl receive-weights` /
// `prepare-weights` send the workers (docs/weight-sync.md). The delta file is read whole into
// memory (its size: a few percent of the checkpoint).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/model_io/safetensors.h"
#include "common/server_main.h"
#include "common/weight_sync/bucket_plan.h"
#include "common/weight_sync/delta_file.h"
#include "nlohmann/json.hpp"
#include "services/worker/weight_sync/weight_sync.h"

namespace {

struct SenderConfig {
  std::string checkpoint;
  std::string listen;
  int world_size = 2;
  std::string group_name;
  std::string backend = "tcp";
  double bucket_mb = 512;
  double timeout_s = 60.0;
  int cuda_device = 0;
  bool plan_only = false;
  bool delta = false;
  std::string log_level = "info";
};

// The delta file's tensors as buckets (greedy by payload bytes, like PlanBuckets): each travels
// as U8[payload bytes] and is listed with its own dtype and shape (the manifest's).
std::vector<rl::weight_sync::Bucket> PlanDeltaBuckets(const rl::weight_sync::DeltaFile& delta,
                                                      int64_t bucket_bytes) {
  std::vector<rl::weight_sync::Bucket> buckets;
  rl::weight_sync::Bucket current;
  for (const rl::weight_sync::DeltaTensor& t : delta.tensors) {
    const int64_t bytes = static_cast<int64_t>(t.delta.payload.size());
    if (!current.specs.empty() && current.bytes + bytes > bucket_bytes) {
      buckets.push_back(std::move(current));
      current = rl::weight_sync::Bucket();
    }
    current.specs.push_back({t.name, "U8", {bytes}});
    current.data.push_back(t.delta.payload);
    current.bytes += bytes;
    // ParseDeltaFile checked that every tensor is in the manifest with its dtype.
    current.listed.push_back({t.name, std::string(rl::model_io::DTypeName(t.dtype)),
                              delta.manifest.tensors.at(t.name).shape});
    current.encodings.emplace_back(rl::weight_sync::DeltaEncodingName(t.delta.encoding));
    current.delta_counts.push_back(t.delta.count);
  }
  if (!current.specs.empty()) buckets.push_back(std::move(current));
  return buckets;
}

// "HOST:PORT" or "[V6]:PORT".
bool SplitHostPort(const std::string& text, std::string* host, int* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  *host = text.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return absl::SimpleAtoi(text.substr(colon + 1), port) && *port >= 0 && *port <= 65535;
}

absl::Status Validate(const SenderConfig& c) {
  auto bad = [](const char* what) { return absl::InvalidArgumentError(what); };
  if (c.checkpoint.empty())
    return bad(
        "--checkpoint is required (a folder; with --delta, one "
        "holding weights.rldelta)");
  if (!(c.bucket_mb * (1 << 20) >= 1)) return bad("--bucket-mb must be > 0");
  if (c.plan_only) return absl::OkStatus();
  if (c.listen.empty()) return bad("--listen HOST:PORT is required");
  if (c.group_name.empty()) return bad("--group-name is required");
  if (c.world_size < 2) return bad("--world-size must be >= 2 (this sender and a receiver)");
  if (c.timeout_s <= 0) return bad("--timeout-s must be > 0");
  return absl::OkStatus();
}

void PrintLine(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

int Run(const SenderConfig& config) {
  const int64_t bucket_bytes = static_cast<int64_t>(config.bucket_mb * (1 << 20));
  // The bytes the buckets point into: the checkpoint, or the delta file.
  absl::StatusOr<rl::model_io::Checkpoint> checkpoint;
  absl::StatusOr<rl::weight_sync::DeltaFile> delta;
  absl::StatusOr<std::vector<rl::weight_sync::Bucket>> buckets;
  int64_t parent_version = -1;
  if (config.delta) {
    const std::string path =
        (std::filesystem::path(config.checkpoint) / rl::weight_sync::kDeltaFileName).string();
    delta = rl::weight_sync::ReadDeltaFile(path, std::numeric_limits<int64_t>::max());
    if (!delta.ok()) {
      std::cerr << "rl-weight-sender: " << delta.status().message() << "\n";
      return 1;
    }
    buckets = PlanDeltaBuckets(*delta, bucket_bytes);
    parent_version = *delta->manifest.parent_version;
  } else {
    checkpoint = rl::model_io::OpenCheckpoint(config.checkpoint);
    if (!checkpoint.ok()) {
      std::cerr << "rl-weight-sender: " << checkpoint.status().message() << "\n";
      return 1;
    }
    buckets = rl::weight_sync::PlanBuckets(*checkpoint, bucket_bytes);
  }
  if (!buckets.ok()) {
    std::cerr << "rl-weight-sender: " << buckets.status().message() << "\n";
    return 1;
  }
  if (config.plan_only) {
    for (size_t i = 0; i < buckets->size(); ++i) {
      PrintLine(rl::weight_sync::BucketJson((*buckets)[i], i, buckets->size(), parent_version));
    }
    return 0;
  }
  rl::weight_sync::GroupOptions options;
  if (!SplitHostPort(config.listen, &options.master_address, &options.master_port)) {
    std::cerr << "rl-weight-sender: --listen: '" << config.listen << "' is not HOST:PORT\n";
    return 2;
  }
  options.backend = config.backend;
  options.rank = 0;
  options.world_size = config.world_size;
  options.group_name = config.group_name;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.timeout_s * 1000));
  options.cuda_device = config.cuda_device;
  auto sender = rl::weight_sync::WeightSender::Create(options);
  if (!sender.ok()) {
    std::cerr << "rl-weight-sender: " << sender.status().message() << "\n";
    return absl::IsInvalidArgument(sender.status()) ? 2 : 1;
  }
  rl::AnnounceListening(rl::JoinHostPort(options.master_address, (*sender)->port()));
  if (absl::Status st = (*sender)->WaitForReceivers(); !st.ok()) {
    std::cerr << "rl-weight-sender: " << st.message() << "\n";
    return 1;
  }
  int64_t total_bytes = 0;
  double total_seconds = 0;
  for (size_t i = 0; i < buckets->size(); ++i) {
    const rl::weight_sync::Bucket& bucket = (*buckets)[i];
    PrintLine(rl::weight_sync::BucketJson(bucket, i, buckets->size(), parent_version));
    auto stats = (*sender)->Broadcast(bucket.specs, bucket.data);
    if (!stats.ok()) {
      std::cerr << "rl-weight-sender: bucket " << i << ": " << stats.status().message() << "\n";
      (*sender)->Close();
      return 1;
    }
    total_bytes += stats->bytes;
    total_seconds += stats->seconds;
    spdlog::info("bucket {}/{}: {} tensors, {} bytes in {:.3f} s", i + 1, buckets->size(),
                 bucket.specs.size(), stats->bytes, stats->seconds);
  }
  (*sender)->Close();
  nlohmann::json done = {{"done", true},
                         {"buckets", buckets->size()},
                         {"bytes", total_bytes},
                         {"seconds", total_seconds},
                         {"receivers", config.world_size - 1}};
  PrintLine(done.dump());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  SenderConfig config;
  rl::FlagSet flags("rl-weight-sender");
  flags.String("checkpoint", &config.checkpoint, "safetensors checkpoint folder");
  flags.String("listen", &config.listen, "HOST:PORT to listen on (port 0: any free port)");
  flags.Int("world-size", &config.world_size, "ranks in the group: this sender + receivers");
  flags.String("group-name", &config.group_name, "group name the workers join with");
  flags.String("backend", &config.backend, "tcp | nccl");
  flags.Double("bucket-mb", &config.bucket_mb, "bucket size in MiB (fractions allowed)");
  flags.Double("timeout-s", &config.timeout_s,
               "bound on group formation and on any stall during a broadcast");
  flags.Int("cuda-device", &config.cuda_device, "nccl: the CUDA device of this rank");
  flags.Bool("plan-only", &config.plan_only, "print the bucket plan and exit");
  flags.Bool("delta", &config.delta,
             "send CHECKPOINT/weights.rldelta (a delta publication) instead of the checkpoint: "
             "the changed tensors' delta payloads; the bucket lines name encodings and the "
             "parent version");
  rl::MainOptions options{
      .program = "rl-weight-sender", .flags = &flags, .log_level = &config.log_level};
  options.validate = [&config] { return Validate(config); };
  if (std::optional<int> exit_code = rl::PrepareMain(argc, argv, options)) return *exit_code;
  return Run(config);
}
