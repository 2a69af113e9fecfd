#include "common/auth.h"

#include <openssl/crypto.h>

#include <cstdlib>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model_io/file_read.h"
#include "common/sha256.h"
#include "spdlog/spdlog.h"

namespace rl {
namespace {

constexpr std::string_view kBearer = "Bearer ";

}  // namespace

BearerAuth::BearerAuth(std::string key) : key_(std::move(key)) {}

absl::Status BearerAuth::CheckHeader(std::optional<std::string_view> header) const {
  if (!enabled()) return absl::OkStatus();
  if (!header.has_value() || header->empty()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <key>' metadata");
  }
  if (!absl::StartsWithIgnoreCase(absl::string_view(header->data(), header->size()), "Bearer ")) {
    return absl::UnauthenticatedError("authorization metadata must be 'Bearer <key>'");
  }
  // Compare fixed-size digests so neither content nor length leaks through timing.
  const std::string_view given = header->substr(kBearer.size());
  Sha256 a, b;
  a.Update(given.data(), given.size());
  b.Update(key_);
  const Sha256Digest da = a.Final(), db = b.Final();
  if (CRYPTO_memcmp(da.data(), db.data(), da.size()) != 0) {
    return absl::PermissionDeniedError("invalid API key");
  }
  return absl::OkStatus();
}

absl::Status BearerAuth::Check(const grpc::ServerContextBase& context) const {
  if (!enabled()) return absl::OkStatus();
  const std::optional<std::string> header = AuthorizationHeader(context);
  return CheckHeader(header ? std::optional<std::string_view>(*header) : std::nullopt);
}

std::string ResolveApiKey(std::string flag_value, const char* env_name) {
  if (!flag_value.empty()) return flag_value;
  const char* env = std::getenv(env_name);
  return env != nullptr ? std::string(env) : std::string();
}

absl::StatusOr<std::string> ResolveApiKey(const ApiKeySource& src) {
  if (!src.file_path.empty()) {
    if (!src.flag_value.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", src.flag_name, " and --", src.flag_name, "-file: give only one"));
    }
    // Opened without blocking and checked with fstat before a byte is read (no FIFO, no
    // directory, at most 4 KiB).
    absl::StatusOr<std::string> text = model_io::ReadSmallFile(src.file_path, 4096);
    if (!text.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", src.flag_name, "-file: ", text.status().message()));
    }
    std::string key = *std::move(text);
    while (!key.empty() &&
           (key.back() == '\n' || key.back() == '\r' || key.back() == ' ' || key.back() == '\t')) {
      key.pop_back();
    }
    if (key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", src.flag_name, "-file: '", src.file_path, "' is empty"));
    }
    return key;
  }
  if (!src.flag_value.empty()) {
    spdlog::warn(
        "--{} was given on the command line, where any local user can read it "
        "(/proc/PID/cmdline); prefer --{}-file or the {} environment variable",
        src.flag_name, src.flag_name, src.env_name);
    return src.flag_value;
  }
  const char* env = std::getenv(src.env_name.c_str());
  return env != nullptr ? std::string(env) : std::string();
}

void ScrubFlagValues(int argc, char** argv, const std::vector<std::string>& flag_names) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") break;
    for (const std::string& name : flag_names) {
      const std::string flag = "--" + name;
      if (arg == flag && i + 1 < argc) {
        for (char* p = argv[i + 1]; *p != '\0'; ++p) *p = '*';
      } else if (arg.size() > flag.size() + 1 && arg.substr(0, flag.size() + 1) == flag + "=") {
        for (char* p = argv[i] + flag.size() + 1; *p != '\0'; ++p) *p = '*';
      }
    }
  }
}

std::optional<std::string> AuthorizationHeader(const grpc::ServerContextBase& context) {
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

void RegisterServerKeyFlags(FlagSet& flags, const ServerKeyFlags& keys,
                            const std::string& data_calls) {
  flags.String("admin-api-key", keys.admin_key,
               "bearer key for admin calls (or env RL_ADMIN_API_KEY)");
  flags.String("api-key", keys.key,
               absl::StrCat("optional bearer key for ", data_calls, " (or env RL_API_KEY)"));
  flags.String("admin-api-key-file", keys.admin_key_file,
               "file holding the admin key (preferred: not visible in the process list)");
  flags.String("api-key-file", keys.key_file,
               absl::StrCat("file holding the ", data_calls, " key"));
}

absl::Status ResolveServerKeys(int argc, char** argv, const ServerKeyFlags& keys) {
  ScrubFlagValues(argc, argv, {"admin-api-key", "api-key"});
  for (auto [key, file, name, env] :
       {std::tuple{keys.admin_key, keys.admin_key_file, "admin-api-key", "RL_ADMIN_API_KEY"},
        std::tuple{keys.key, keys.key_file, "api-key", "RL_API_KEY"}}) {
    absl::StatusOr<std::string> resolved = ResolveApiKey({name, *key, *file, env});
    if (!resolved.ok()) return resolved.status();
    *key = *std::move(resolved);
  }
  return absl::OkStatus();
}

}  // namespace rl
