// The tokenizer folder as one ZIP archive, for SglangScheduler.GetTokenizer: the gateway builds
// its tokenizer from it. Holds the files a tokenizer needs (tokenizer.json, its config, special
// tokens, vocab/merges, SentencePiece/tiktoken models, chat templates, config.json and
// generation_config.json), deflated, at the archive's top level, and the archive's SHA-256.
// Built once, on first use, from a folder fixed for the process's lifetime; every file is size
// checked before it is read (kMaxTokenizerFileBytes each, kMaxTokenizerBundleBytes in all).
// rl-worker serves its model folder's, rl-router its --tokenizer folder's. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_callback.h"
#include "sglang_scheduler.grpc.pb.h"

namespace rl::sglang {

inline constexpr int64_t kMaxTokenizerFileBytes = int64_t{256} << 20;
inline constexpr int64_t kMaxTokenizerBundleBytes = int64_t{512} << 20;

struct TokenizerArchive {
  std::string zip;     // the archive's bytes
  std::string sha256;  // lowercase hex of SHA-256(zip)
};

// Builds the archive of `dir`. NOT_FOUND when the folder holds no tokenizer file;
// RESOURCE_EXHAUSTED past the size limits; INTERNAL when the ZIP library fails.
absl::StatusOr<TokenizerArchive> BuildTokenizerArchive(const std::string& dir);

// Caches BuildTokenizerArchive(dir) after the first success (a failure is retried next time).
class TokenizerBundle {
 public:
  explicit TokenizerBundle(std::string dir) : dir_(std::move(dir)) {}
  absl::StatusOr<std::shared_ptr<const TokenizerArchive>> Get();

 private:
  const std::string dir_;
  absl::Mutex mu_;
  std::shared_ptr<const TokenizerArchive> archive_ ABSL_GUARDED_BY(mu_);
};

// A reactor for one GetTokenizer call: streams `archive` in 64 KiB chunks, the last carrying
// the SHA-256, or ends with the error. Deletes itself when done.
grpc::ServerWriteReactor<::smg::grpc::common::GetTokenizerChunk>* NewTokenizerReactor(
    absl::StatusOr<std::shared_ptr<const TokenizerArchive>> archive);

}  // namespace rl::sglang
