// DnsResolver (services/router/discovery/dns_resolver.h) failures without a network: a server
// that never answers is UNAVAILABLE within its timeout × tries (never a hang), a bad server
// address is refused at creation. Real answers: tests/reliability/test_dns_discovery.py.
#include "services/router/discovery/dns_resolver.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace rl::router::discovery {
namespace {

TEST(DnsResolverTest, SilentServerIsUnavailableNotAHang) {
  // A bound UDP socket that reads nothing: queries vanish.
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  DnsResolverOptions o;
  o.server = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  o.timeout = std::chrono::milliseconds(100);
  o.tries = 1;
  auto r = DnsResolver::Create(o);
  ASSERT_TRUE(r.ok()) << r.status();
  auto ips = (*r)->Resolve("workers.rl.test");
  EXPECT_EQ(ips.status().code(), absl::StatusCode::kUnavailable) << ips.status();
  EXPECT_NE(ips.status().message().find("workers.rl.test"), std::string::npos) << ips.status();
  close(fd);
}

TEST(DnsResolverTest, BadServerAddressIsRefused) {
  DnsResolverOptions o;
  o.server = "not an address";
  auto r = DnsResolver::Create(o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("--dns-server"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace rl::router::discovery
