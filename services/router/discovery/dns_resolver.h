// DnsResolver: a host name's addresses from DNS through c-ares (the resolver gRPC itself uses),
// for the router's worker discovery (--worker-dns). The server is the system's
// (/etc/resolv.conf: a pod's cluster DNS, with its search domains) unless one is given
// (--dns-server HOST:PORT, e.g. a fake server in tests). A lookup asks A and AAAA records at once
// and waits with poll() (no FD_SETSIZE limit on a router holding many sockets).
//
// Cost: one lookup is a few UDP datagrams, bounded by `timeout` × `tries`. Thread-safe (lookups
// are serialized on the one channel).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace rl::router::discovery {

struct DnsResolverOptions {
  // "HOST:PORT" ("[V6]:PORT") of the DNS server; "" = the system's configuration.
  std::string server;
  std::chrono::milliseconds timeout{2000};  // per try
  int tries = 2;
};

class DnsResolver {
 public:
  // InvalidArgument for a bad server address.
  static absl::StatusOr<std::unique_ptr<DnsResolver>> Create(const DnsResolverOptions& options);
  ~DnsResolver();
  DnsResolver(const DnsResolver&) = delete;
  DnsResolver& operator=(const DnsResolver&) = delete;

  // The IPv4 and IPv6 addresses of `name` as text, sorted and unique. A name that exists with no
  // address, or does not exist (NXDOMAIN), is an empty list: a fleet scaled to zero. Unavailable
  // when the server does not answer or fails (the caller keeps what it had).
  absl::StatusOr<std::vector<std::string>> Resolve(const std::string& name)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  DnsResolver() = default;
  absl::Mutex mu_;
  void* channel_ ABSL_GUARDED_BY(mu_) = nullptr;  // ares_channel
};

}  // namespace rl::router::discovery
