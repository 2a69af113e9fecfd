// libFuzzer target for the safetensors header parser: any bytes are parsed as a whole file and
// must give views inside the buffer or a clean error, never a crash, a hang or a huge
// allocation. Build and run: see tests/fuzz/CMakeLists.txt and scripts/fuzz.
#include <cstdint>
#include <cstdlib>

#include "common/model_io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto views = rl::model_io::ParseSafetensors(absl::MakeConstSpan(data, size), "fuzz");
  if (!views.ok()) return 0;
  for (const auto& v : *views) {
    // Every view lies inside the input and has exactly shape x dtype bytes.
    if (v.data.data() < data || v.data.data() + v.data.size() > data + size) std::abort();
    if (static_cast<uint64_t>(v.NumElements()) * rl::model_io::DTypeSize(v.dtype) !=
        v.data.size()) {
      std::abort();
    }
  }
  return 0;
}
