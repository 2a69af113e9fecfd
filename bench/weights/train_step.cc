#include "bench/weights/train_step.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "common/model_io/dtype.h"
#include "common/model_io/safetensors.h"
#include "common/status.h"

namespace rl::bench {

namespace fs = std::filesystem;

absl::Status WriteStep(const std::string& parent, const std::string& child, double density,
                       uint64_t seed) {
  ASSIGN_OR_RETURN(rl::model_io::Checkpoint ckpt, rl::model_io::OpenCheckpoint(parent));
  fs::create_directories(child);
  for (const auto& e : fs::directory_iterator(parent)) {
    if (e.path().extension() != ".safetensors" &&
        e.path().filename() != "model.safetensors.index.json") {
      fs::copy_file(e.path(), fs::path(child) / e.path().filename(),
                    fs::copy_options::overwrite_existing);
    }
  }
  std::vector<rl::model_io::TensorToWrite> specs;
  std::vector<const rl::model_io::TensorView*> views;
  for (const auto& [name, v] : ckpt.tensors()) {
    specs.push_back({name, v.dtype, v.shape, {}});
    views.push_back(&v);
  }
  std::mt19937_64 rng(seed);
  return rl::model_io::WriteCheckpoint(
      child, specs,
      [&](size_t i, absl::Span<uint8_t> out) -> absl::Status {
        const rl::model_io::TensorView& v = *views[i];
        std::memcpy(out.data(), v.data.data(), v.data.size());
        const int64_t width = rl::model_io::DTypeSize(v.dtype);
        const int64_t numel = static_cast<int64_t>(out.size()) / width;
        std::geometric_distribution<int64_t> gap(density);  // Bernoulli(density) positions
        std::normal_distribution<float> step(0.0f, 0.01f);
        for (int64_t k = gap(rng); k < numel; k += 1 + gap(rng)) {
          float f;
          rl::model_io::ConvertToF32(v.dtype, out.data() + k * width, 1, &f);
          f += step(rng) + (f >= 0 ? 1e-2f : -1e-2f) * std::abs(f);
          rl::model_io::ConvertFromF32(&f, 1, v.dtype, out.data() + k * width);
        }
        return absl::OkStatus();
      },
      int64_t{2} << 30);
}

}  // namespace rl::bench
