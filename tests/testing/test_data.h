// Where tests find things: the shared test data (RL_TEST_DATA, which ctest sets; default
// ../shared/models from the checkout), the build folder (RL_BUILD_DIR), fresh temporary
// folders, and whole files read back. Header-only; every C++ test reaches these through here.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

namespace rl::testing {

// The shared test data folder (stories260K, tokenizers; ../corpus beside it).
inline std::string DataDir() {
  const char* env = std::getenv("RL_TEST_DATA");
  return env != nullptr && *env != '\0' ? env : "../shared/models";
}
inline std::string Stories() { return DataDir() + "/stories260K"; }

// The build folder: RL_BUILD_DIR, else the parent of the folder holding this test binary
// (test binaries live in BUILD/tests, servers in BUILD/bin).
inline std::string BuildDir() {
  const char* env = std::getenv("RL_BUILD_DIR");
  if (env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("build") : exe.parent_path().parent_path().string();
}

// A fresh, empty temporary folder, removed with its contents at destruction. Not copyable.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "rl-test-XXXXXX").string();
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // Empty when the folder could not be made (tests then fail on their first write).
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A fresh, empty folder `name` (emptied if it exists) inside one temporary folder per test
// process, removed with it at exit: for fixtures whose files live as long as the binary, or
// whose setup names its folders.
inline std::string ProcessTempDir(const std::string& name) {
  static const TempDir root;
  const std::string dir = root.Sub(name);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  return dir;
}

// The whole file at `path` (bytes as they are); empty when it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace rl::testing
