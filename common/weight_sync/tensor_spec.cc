#include "common/weight_sync/tensor_spec.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_io/dtype.h"

namespace rl::weight_sync {

absl::StatusOr<int64_t> TensorBytes(const TensorSpec& spec) {
  auto dtype = model_io::ParseDType(spec.dtype);
  if (!dtype.has_value() ||
      (!model_io::IsFloatWeightDType(*dtype) && *dtype != model_io::DType::kU8)) {
    return absl::InvalidArgumentError(absl::StrCat("dtype '", spec.dtype, "' of '", spec.name,
                                                   "' is not one of F32, BF16, F16, U8"));
  }
  int64_t n = model_io::DTypeSize(*dtype);
  for (int64_t d : spec.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape of '", spec.name, "' has a negative dimension"));
    }
    if (d != 0 && n > INT64_MAX / d) {
      return absl::InvalidArgumentError(absl::StrCat("size of '", spec.name, "' overflows"));
    }
    n *= d;
  }
  return n;
}

std::string DescribeSpec(const TensorSpec& spec) {
  return absl::StrCat("'", spec.name, "' ", spec.dtype, "[", absl::StrJoin(spec.shape, ", "), "]");
}

}  // namespace rl::weight_sync
