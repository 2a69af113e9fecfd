#include "kernels/silu_mul.h"

namespace rl::kernels {

absl::Status SiluMulParams::Validate() const {
  if (gate == nullptr || up == nullptr || out == nullptr || n < 0) {
    return absl::InvalidArgumentError("silu_mul: null buffer or negative size");
  }
  return absl::OkStatus();
}

}  // namespace rl::kernels
