// Bearer-key authentication for gRPC calls.
//
// A call carries metadata `authorization: Bearer <key>`. With no key configured every call
// passes. A missing header is UNAUTHENTICATED, a wrong key PERMISSION_DENIED. Keys are compared
// in constant time (OpenSSL CRYPTO_memcmp over equal-length digests) and never logged or put in
// error messages. Thread-safe (immutable after construction).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "grpcpp/server_context.h"

namespace rl {

class BearerAuth {
 public:
  // An empty key disables the check.
  explicit BearerAuth(std::string key);
  bool enabled() const { return !key_.empty(); }
  // Checks the `authorization` value of a call (nullopt when the header is absent).
  absl::Status CheckHeader(std::optional<std::string_view> header) const;
  // Reads the header from the call's client metadata and checks it.
  absl::Status Check(const grpc::ServerContextBase& context) const;

 private:
  std::string key_;
};

// The key from the flag value, falling back to the environment variable `env_name` when the flag
// is empty.
std::string ResolveApiKey(std::string flag_value, const char* env_name);

// The `authorization` metadata value of a call, if any (for forwarding to workers).
std::optional<std::string> AuthorizationHeader(const grpc::ServerContextBase& context);

}  // namespace rl
