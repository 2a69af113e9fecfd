// Weight publications for tests (docs/weight-publications.md): a trainer step written as a new
// checkpoint (a seeded fraction of every tensor's elements moved a little) and a checkpoint's
// manifest. Header-only; the test links the model_io and weight_sync libraries (through
// rl_worker_server).
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model_io/safetensors.h"
#include "common/weight_sync/manifest.h"

namespace rl::testing {

// Copies the float32 checkpoint `from` into `dir` (config.json, model.safetensors) with
// `fraction` of every tensor's elements moved by 0.01 (a trainer step), seeded.
inline absl::Status WriteTrainerStep(const std::string& from, const std::string& dir,
                                     double fraction, uint64_t seed) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::filesystem::copy_file(from + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return absl::InternalError(absl::StrCat("copy config.json: ", ec.message()));
  auto ckpt = model_io::OpenCheckpoint(from);
  if (!ckpt.ok()) return ckpt.status();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<model_io::TensorToWrite> out;
  for (const auto& [name, t] : ckpt->tensors()) {
    if (t.dtype != model_io::DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": not float32"));
    }
    storage.emplace_back(t.data.begin(), t.data.end());
    auto* f = reinterpret_cast<float*>(storage.back().data());
    for (size_t i = 0; i < storage.back().size() / 4; ++i) {
      if (u(rng) < fraction) f[i] += 0.01f;
    }
    out.push_back({name, t.dtype, t.shape, {}});
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].data = storage[i];
  return model_io::WriteSafetensors(dir + "/model.safetensors", out);
}

// Writes DIR/rl-manifest.json for the checkpoint in `dir` as version `version`.
inline absl::Status WriteManifestOf(const std::string& dir, int64_t version) {
  auto ckpt = model_io::OpenCheckpoint(dir);
  if (!ckpt.ok()) return ckpt.status();
  return weight_sync::WriteManifest(dir, weight_sync::ManifestOfCheckpoint(*ckpt, version));
}

}  // namespace rl::testing
