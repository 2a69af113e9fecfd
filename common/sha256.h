// SHA256 helpers over OpenSSL's EVP interface, for the weights checker.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace rl {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental hasher. Not thread-safe; cheap to create.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size);
  void Update(std::string_view data) { Update(data.data(), data.size()); }
  Sha256Digest Final();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

std::string ToHex(const Sha256Digest& digest);
std::string Sha256Hex(std::string_view data);

}  // namespace rl
