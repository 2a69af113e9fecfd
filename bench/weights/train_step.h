// WriteStep: one made "trainer step" for the weight benchmarks (publication_bench, refit_bench):
// a child checkpoint of `parent` where each element of every tensor moved, with probability
// `density`, by a small random step (geometric gaps between moved elements: the Bernoulli
// pattern without a draw per element). Everything else in the parent's folder but its
// safetensors files is copied. Deterministic for a `seed`. Cost: one pass over the weights.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace rl::bench {

absl::Status WriteStep(const std::string& parent, const std::string& child, double density,
                       uint64_t seed);

}  // namespace rl::bench
