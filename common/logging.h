// Logging: spdlog, one process-wide logger writing to stderr (stdout is reserved for the
// machine-readable `listening on HOST:PORT` line and rlctl output). Use the SPDLOG_* macros or
// spdlog::info(...) directly after InitLogging.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

namespace rl {

// Sets up the stderr logger with `level` ("trace", "debug", "info", "warn", "error", "off").
// Unknown levels are an InvalidArgument error. Calling it again replaces the logger.
absl::Status InitLogging(absl::string_view level);

}  // namespace rl
