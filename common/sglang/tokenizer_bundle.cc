#include "common/sglang/tokenizer_bundle.h"

#include <zip.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <set>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/sha256.h"
#include "common/status.h"

namespace rl::sglang {
namespace {

namespace fs = std::filesystem;

// The files SMG's own servicers bundle (its tokenizer hub's list plus model config files).
constexpr std::array<const char*, 13> kTokenizerFiles = {"tokenizer.json",
                                                         "tokenizer_config.json",
                                                         "config.json",
                                                         "generation_config.json",
                                                         "special_tokens_map.json",
                                                         "vocab.json",
                                                         "merges.txt",
                                                         "tokenizer.model",
                                                         "tiktoken.model",
                                                         "chat_template.json",
                                                         "preprocessor_config.json",
                                                         "processor_config.json",
                                                         "video_preprocessor_config.json"};
constexpr std::array<const char*, 3> kTokenizerSuffixes = {".tiktoken", ".jinja", ".model"};

absl::Status ZipError(const char* what, zip_error_t* error) {
  absl::Status s = absl::InternalError(absl::StrCat(what, ": ", zip_error_strerror(error)));
  zip_error_fini(error);
  return s;
}

// Names (relative to `dir`) of the regular files to bundle, in a stable order.
absl::StatusOr<std::vector<std::string>> ListFiles(const fs::path& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const char* name : kTokenizerFiles) {
    if (fs::is_regular_file(dir / name, ec)) names.insert(name);
  }
  fs::directory_iterator it(dir, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat("tokenizer folder ", dir.string(), ": ", ec.message()));
  }
  for (const fs::directory_entry& entry : it) {
    if (!entry.is_regular_file(ec)) continue;
    const std::string name = entry.path().filename().string();
    for (const char* suffix : kTokenizerSuffixes) {
      if (absl::EndsWith(name, suffix)) names.insert(name);
    }
  }
  if (names.empty()) {
    return absl::NotFoundError(absl::StrCat("no tokenizer file in ", dir.string()));
  }
  return std::vector<std::string>(names.begin(), names.end());
}

constexpr int kTokenizerChunkBytes = 64 << 10;

// Streams the tokenizer archive in kTokenizerChunkBytes pieces; the last carries the SHA-256.
class TokenizerReactor final
    : public grpc::ServerWriteReactor<::smg::grpc::common::GetTokenizerChunk> {
 public:
  explicit TokenizerReactor(absl::StatusOr<std::shared_ptr<const TokenizerArchive>> archive) {
    if (!archive.ok()) {
      Finish(ToGrpcStatus(archive.status()));
      return;
    }
    archive_ = *std::move(archive);
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled"));
      return;
    }
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    const std::string& zip = archive_->zip;
    if (offset_ >= zip.size()) {
      Finish(grpc::Status::OK);
      return;
    }
    const size_t end = std::min(zip.size(), offset_ + kTokenizerChunkBytes);
    chunk_.set_data(zip.substr(offset_, end - offset_));
    chunk_.set_sha256(end == zip.size() ? archive_->sha256 : "");
    offset_ = end;
    StartWrite(&chunk_);
  }

  std::shared_ptr<const TokenizerArchive> archive_;
  size_t offset_ = 0;
  ::smg::grpc::common::GetTokenizerChunk chunk_;
};

}  // namespace

absl::StatusOr<TokenizerArchive> BuildTokenizerArchive(const std::string& dir_name) {
  const fs::path dir(dir_name);
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListFiles(dir));
  int64_t total = 0;
  for (const std::string& name : names) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(dir / name, ec);
    if (ec) return absl::NotFoundError(absl::StrCat(name, ": ", ec.message()));
    if (static_cast<int64_t>(size) > kMaxTokenizerFileBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          name, ": ", size, " bytes, more than the limit of ", kMaxTokenizerFileBytes));
    }
    total += static_cast<int64_t>(size);
  }
  if (total > kMaxTokenizerBundleBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tokenizer files: ", total, " bytes, more than the limit of ", kMaxTokenizerBundleBytes));
  }

  zip_error_t error;
  zip_error_init(&error);
  zip_source_t* buffer = zip_source_buffer_create(nullptr, 0, 0, &error);
  if (buffer == nullptr) return ZipError("zip_source_buffer_create", &error);
  zip_source_keep(buffer);  // still ours after zip_close
  zip_t* archive = zip_open_from_source(buffer, ZIP_TRUNCATE, &error);
  if (archive == nullptr) {
    zip_source_free(buffer);
    return ZipError("zip_open_from_source", &error);
  }
  for (const std::string& name : names) {
    const std::string path = (dir / name).string();
    zip_source_t* file = zip_source_file(archive, path.c_str(), 0, -1);
    if (file == nullptr || zip_file_add(archive, name.c_str(), file, ZIP_FL_ENC_UTF_8) < 0) {
      if (file != nullptr) zip_source_free(file);
      absl::Status s = absl::InternalError(
          absl::StrCat("zip ", name, ": ", zip_error_strerror(zip_get_error(archive))));
      zip_discard(archive);
      zip_source_free(buffer);
      return s;
    }
  }
  if (zip_close(archive) < 0) {
    absl::Status s = absl::InternalError(
        absl::StrCat("zip_close: ", zip_error_strerror(zip_get_error(archive))));
    zip_discard(archive);
    zip_source_free(buffer);
    return s;
  }

  TokenizerArchive out;
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_source_stat(buffer, &st) < 0 || !(st.valid & ZIP_STAT_SIZE) ||
      zip_source_open(buffer) < 0) {
    zip_source_free(buffer);
    return absl::InternalError("zip: cannot read back the archive");
  }
  out.zip.resize(st.size);
  const zip_int64_t n = zip_source_read(buffer, out.zip.data(), st.size);
  zip_source_close(buffer);
  zip_source_free(buffer);
  if (n != static_cast<zip_int64_t>(st.size)) {
    return absl::InternalError("zip: short read of the archive");
  }
  out.sha256 = Sha256Hex(out.zip);
  return out;
}

absl::StatusOr<std::shared_ptr<const TokenizerArchive>> TokenizerBundle::Get() {
  absl::MutexLock lock(&mu_);
  if (archive_ == nullptr) {
    ASSIGN_OR_RETURN(TokenizerArchive built, BuildTokenizerArchive(dir_));
    archive_ = std::make_shared<const TokenizerArchive>(std::move(built));
  }
  return archive_;
}

grpc::ServerWriteReactor<::smg::grpc::common::GetTokenizerChunk>* NewTokenizerReactor(
    absl::StatusOr<std::shared_ptr<const TokenizerArchive>> archive) {
  return new TokenizerReactor(std::move(archive));
}

}  // namespace rl::sglang
