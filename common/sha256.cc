#include "common/sha256.h"

#include <openssl/evp.h>

#include "common/check.h"

namespace rl {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  // Allocation failure of a 200-byte context leaves nothing sensible to do.
  RL_CHECK(ctx_->md != nullptr && EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) == 1);
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_->md); }

void Sha256::Update(const void* data, size_t size) { EVP_DigestUpdate(ctx_->md, data, size); }

Sha256Digest Sha256::Final() {
  Sha256Digest out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_->md, out.data(), &len);
  return out;
}

std::string ToHex(const Sha256Digest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint8_t b : digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

std::string Sha256Hex(std::string_view data) {
  Sha256 h;
  h.Update(data);
  return ToHex(h.Final());
}

}  // namespace rl
