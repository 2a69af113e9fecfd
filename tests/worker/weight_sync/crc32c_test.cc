#include "services/worker/weight_sync/crc32c.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace rl::weight_sync {
namespace {

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c(Bytes("")), 0u);
  EXPECT_EQ(Crc32c(Bytes("123456789")), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(Crc32c(zeros), 0x8A9136AAu);  // RFC 3720 B.4
  std::vector<uint8_t> ones(32, 0xFF);
  EXPECT_EQ(Crc32c(ones), 0x62A8AB43u);
}

TEST(Crc32cTest, ExtendMatchesOneShotAtEveryAlignmentAndSplit) {
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t start = 0; start < 9; ++start) {
    absl::Span<const uint8_t> s(data.data() + start, data.size() - start);
    const uint32_t whole = Crc32c(s);
    for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{33}, s.size()}) {
      uint32_t c = Crc32cExtend(0, s.data(), split);
      c = Crc32cExtend(c, s.data() + split, s.size() - split);
      EXPECT_EQ(c, whole) << "start " << start << " split " << split;
    }
  }
}

}  // namespace
}  // namespace rl::weight_sync
