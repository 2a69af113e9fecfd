#include "common/auth.h"

#include <openssl/crypto.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "common/sha256.h"

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

std::optional<std::string> AuthorizationHeader(const grpc::ServerContextBase& context) {
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

}  // namespace rl
