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
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/flags.h"
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

// Where a key may come from, in order of preference: a file (`--<flag>-file`, the way a
// Kubernetes Secret is mounted; trailing whitespace and newlines are trimmed), the environment
// variable, or the flag itself (visible to every local user in /proc/PID/cmdline and `ps`: a
// warning is logged; main scrubs it from argv with ScrubFlagValues). Giving both the file and
// the flag is an error, as is a file that is not a regular file, is empty, or is larger than
// 4 KiB. An empty result means "no key".
struct ApiKeySource {
  std::string flag_name;   // "admin-api-key"
  std::string flag_value;  // --admin-api-key
  std::string file_path;   // --admin-api-key-file
  std::string env_name;    // RL_ADMIN_API_KEY
};
absl::StatusOr<std::string> ResolveApiKey(const ApiKeySource& source);

// Overwrites the values of the named flags in argv (`--name V` and `--name=V`) with '*' so that
// secrets passed on the command line stop showing in /proc/PID/cmdline. Call after parsing.
void ScrubFlagValues(int argc, char** argv, const std::vector<std::string>& flag_names);

// The two keys of a server process: the admin key and the optional data-plane key, each from a
// flag, a file or the environment (RL_ADMIN_API_KEY, RL_API_KEY).
struct ServerKeyFlags {
  std::string* admin_key;
  std::string* admin_key_file;
  std::string* key;
  std::string* key_file;
};
// Registers --admin-api-key(-file) and --api-key(-file); `data_calls` says what the data-plane
// key guards, for the help text.
void RegisterServerKeyFlags(FlagSet& flags, const ServerKeyFlags& keys,
                            const std::string& data_calls);
// After parsing: scrubs both key flags from argv, then resolves each key in place (file,
// environment, flag). The error names the flag at fault.
absl::Status ResolveServerKeys(int argc, char** argv, const ServerKeyFlags& keys);

// The `authorization` metadata value of a call, if any (for forwarding to workers).
std::optional<std::string> AuthorizationHeader(const grpc::ServerContextBase& context);

}  // namespace rl
