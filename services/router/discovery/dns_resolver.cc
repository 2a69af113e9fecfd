#include "services/router/discovery/dns_resolver.h"

#include <ares.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace rl::router::discovery {
namespace {

absl::Status AresError(const std::string& what, int code) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ares_strerror(code)));
}

// What one ares_getaddrinfo call answered.
struct Lookup {
  bool done = false;
  int status = ARES_SUCCESS;
  std::vector<std::string> addresses;
};

void OnAddrInfo(void* arg, int status, int /*timeouts*/, struct ares_addrinfo* result) {
  auto* lookup = static_cast<Lookup*>(arg);
  lookup->done = true;
  lookup->status = status;
  if (result == nullptr) return;
  for (const ares_addrinfo_node* n = result->nodes; n != nullptr; n = n->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = nullptr;
    if (n->ai_family == AF_INET) {
      raw = &reinterpret_cast<const sockaddr_in*>(n->ai_addr)->sin_addr;
    } else if (n->ai_family == AF_INET6) {
      raw = &reinterpret_cast<const sockaddr_in6*>(n->ai_addr)->sin6_addr;
    }
    if (raw != nullptr && inet_ntop(n->ai_family, raw, text, sizeof(text)) != nullptr) {
      lookup->addresses.emplace_back(text);
    }
  }
  ares_freeaddrinfo(result);
}

// Runs the channel's queries until `lookup` is done (c-ares answers or times it out itself).
void Drive(ares_channel channel, const Lookup& lookup) {
  while (!lookup.done) {
    ares_socket_t socks[ARES_GETSOCK_MAXNUM];
    const int mask = ares_getsock(channel, socks, ARES_GETSOCK_MAXNUM);
    pollfd fds[ARES_GETSOCK_MAXNUM];
    nfds_t n = 0;
    for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
      const bool r = ARES_GETSOCK_READABLE(mask, i);
      const bool w = ARES_GETSOCK_WRITABLE(mask, i);
      if (!r && !w) continue;
      fds[n].fd = socks[i];
      fds[n].events = static_cast<short>((r ? POLLIN : 0) | (w ? POLLOUT : 0));
      fds[n].revents = 0;
      ++n;
    }
    timeval tv{};
    const timeval* next = ares_timeout(channel, nullptr, &tv);
    const int wait_ms =
        next == nullptr ? 1000 : static_cast<int>(next->tv_sec * 1000 + next->tv_usec / 1000);
    const int ready = poll(fds, n, std::max(wait_ms, 1));
    if (ready <= 0) {
      ares_process_fd(channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);  // timeouts
      continue;
    }
    for (nfds_t i = 0; i < n; ++i) {
      const bool r = (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) != 0;
      const bool w = (fds[i].revents & POLLOUT) != 0;
      if (!r && !w) continue;
      ares_process_fd(channel, r ? fds[i].fd : ARES_SOCKET_BAD, w ? fds[i].fd : ARES_SOCKET_BAD);
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<DnsResolver>> DnsResolver::Create(
    const DnsResolverOptions& options) {
  static std::once_flag init;
  static int init_status = ARES_SUCCESS;
  std::call_once(init, [] { init_status = ares_library_init(ARES_LIB_INIT_ALL); });
  if (init_status != ARES_SUCCESS) return AresError("c-ares init", init_status);
  ares_options opts{};
  opts.timeout = static_cast<int>(options.timeout.count());
  opts.tries = std::max(options.tries, 1);
  int mask = ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES;
  char dns_only[] = "b";
  if (!options.server.empty()) {
    // A given server answers for every name: no /etc/hosts.
    opts.lookups = dns_only;
    mask |= ARES_OPT_LOOKUPS;
  }
  ares_channel channel = nullptr;
  if (int rc = ares_init_options(&channel, &opts, mask); rc != ARES_SUCCESS) {
    return AresError("c-ares channel", rc);
  }
  if (!options.server.empty()) {
    if (int rc = ares_set_servers_ports_csv(channel, options.server.c_str()); rc != ARES_SUCCESS) {
      ares_destroy(channel);
      return absl::InvalidArgumentError(absl::StrCat(
          "--dns-server: '", options.server, "' is not HOST:PORT (", ares_strerror(rc), ")"));
    }
  }
  std::unique_ptr<DnsResolver> r(new DnsResolver());
  absl::MutexLock lock(&r->mu_);
  r->channel_ = channel;
  return r;
}

DnsResolver::~DnsResolver() {
  absl::MutexLock lock(&mu_);
  if (channel_ != nullptr) ares_destroy(static_cast<ares_channel>(channel_));
}

absl::StatusOr<std::vector<std::string>> DnsResolver::Resolve(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto channel = static_cast<ares_channel>(channel_);
  Lookup lookup;
  ares_addrinfo_hints hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_flags = ARES_AI_NOSORT;
  ares_getaddrinfo(channel, name.c_str(), nullptr, &hints, OnAddrInfo, &lookup);
  Drive(channel, lookup);
  if (lookup.status == ARES_ENOTFOUND || lookup.status == ARES_ENODATA) {
    return std::vector<std::string>{};
  }
  if (lookup.status != ARES_SUCCESS)
    return AresError(absl::StrCat("resolving ", name), lookup.status);
  std::sort(lookup.addresses.begin(), lookup.addresses.end());
  lookup.addresses.erase(std::unique(lookup.addresses.begin(), lookup.addresses.end()),
                         lookup.addresses.end());
  return lookup.addresses;
}

}  // namespace rl::router::discovery
