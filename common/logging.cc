#include "common/logging.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace rl {

absl::Status InitLogging(absl::string_view level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-level: unknown level '", level, "' (trace|debug|info|warn|error|off)"));
  }
  spdlog::drop("rl");  // a second call (tests) replaces the logger
  auto logger = spdlog::stderr_color_mt("rl");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %v");
  logger->set_level(parsed);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace rl
