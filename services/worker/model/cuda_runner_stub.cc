// The CUDA entry points of a build without CUDA (nvcc was not found at configure time).
#include "absl/status/status.h"
#include "services/worker/model/cuda_runner.h"

namespace rl::model {
namespace {
absl::Status NotBuilt() {
  return absl::FailedPreconditionError(
      "this build has no CUDA backend (nvcc was not found when it was configured)");
}
}  // namespace

bool CudaBackendBuilt() { return false; }
int NumCudaDevices() { return 0; }
absl::StatusOr<std::string> DescribeCudaDevice(int) { return NotBuilt(); }
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions&) {
  return NotBuilt();
}
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaModelRunner(const RunnerOptions&) {
  return NotBuilt();
}
absl::StatusOr<double> MeasureCudaCopyBandwidth(int, int64_t) { return NotBuilt(); }
absl::StatusOr<int64_t> CudaFreeMemory(int) { return NotBuilt(); }

}  // namespace rl::model
