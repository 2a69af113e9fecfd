// libFuzzer target for the request protos: the first byte picks the message (every request type
// of rl.v1.Worker, rl.v1.Router and rl.v1.Admin), the rest is parsed as its wire bytes; parsed
// messages go through the request-limit checks the servers run before doing any work. Nothing
// may crash, and an error message is always bounded (it never echoes unbounded input).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/request_limits.h"
#include "rl/v1/admin.pb.h"
#include "rl/v1/router.pb.h"
#include "rl/v1/worker.pb.h"

namespace {

void CheckBounded(const absl::Status& s) {
  if (!s.ok() && s.message().size() > 2048) std::abort();
}

template <typename T>
std::unique_ptr<T> Parse(const uint8_t* data, size_t size) {
  auto m = std::make_unique<T>();
  if (!m->ParseFromArray(data, static_cast<int>(size))) return nullptr;
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const rl::RequestLimits limits;
  const uint8_t kind = data[0] % 12;
  ++data;
  --size;
  switch (kind) {
    case 0:
      if (auto m = Parse<rl::v1::GenerateRequest>(data, size)) {
        CheckBounded(rl::CheckGenerateRequest(*m, limits, 4096));
        CheckBounded(rl::CheckGenerateRequest(*m, limits));
      }
      break;
    case 1:
      if (auto m = Parse<rl::v1::UpdateWeightsFromTensorRequest>(data, size)) {
        int64_t bytes = 0;
        const absl::Status s = rl::CheckTensorChunk(m->chunk(), limits, &bytes);
        CheckBounded(s);
        if (s.ok() && (bytes < 0 || bytes > limits.max_update_bytes)) std::abort();
      }
      break;
    case 2:
      if (auto m = Parse<rl::v1::UpdateWeightsFromDiskRequest>(data, size)) {
        CheckBounded(rl::CheckPath("model_path", m->model_path(), limits));
      }
      break;
    case 3:
      if (auto m = Parse<rl::v1::AddWorkerRequest>(data, size)) {
        CheckBounded(rl::CheckAddress(m->address(), limits));
      }
      break;
    case 4:
      if (auto m = Parse<rl::v1::AbortRequest>(data, size)) (void)m->ByteSizeLong();
      break;
    case 5:
      if (auto m = Parse<rl::v1::RetrieveFromTextRequest>(data, size)) (void)m->ByteSizeLong();
      break;
    case 6:
      (void)Parse<rl::v1::PauseGenerationRequest>(data, size);
      break;
    case 7:
      (void)Parse<rl::v1::InitWeightsUpdateGroupRequest>(data, size);
      break;
    case 8:
      (void)Parse<rl::v1::UpdateWeightsFromDistributedRequest>(data, size);
      break;
    case 9:
      (void)Parse<rl::v1::WeightsCheckerRequest>(data, size);
      break;
    case 10:
      (void)Parse<rl::v1::SetWorkerEnabledRequest>(data, size);
      break;
    default:
      (void)Parse<rl::v1::RemoveWorkerRequest>(data, size);
      break;
  }
  return 0;
}
