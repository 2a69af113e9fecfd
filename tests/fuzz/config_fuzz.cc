// libFuzzer target for config.json: ParseModelConfig must accept a valid model or return an
// error naming the field, whatever the bytes (deep nesting, huge numbers, wrong types).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/model_io/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = rl::model_io::ParseModelConfig(text);
  if (config.ok()) {
    // An accepted config has usable, positive shapes.
    if (config->vocab_size <= 0 || config->hidden_size <= 0 || config->num_hidden_layers <= 0 ||
        config->head_dim <= 0) {
      std::abort();
    }
    (void)rl::model_io::ModelConfigToJson(*config);
  }
  return 0;
}
