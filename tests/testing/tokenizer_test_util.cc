#include "tests/testing/tokenizer_test_util.h"

#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "gtest/gtest.h"
#include "tests/testing/test_data.h"

namespace rl::tokenizer::testing {

std::string DataDir() { return ::rl::testing::DataDir(); }

std::string CorpusDir() { return DataDir() + "/../corpus"; }

std::string TokenizerPath(const std::string& name) {
  if (name == "stories260K") return DataDir() + "/stories260K/tokenizer.json";
  return DataDir() + "/tokenizers/" + name + "/tokenizer.json";
}

const Tokenizer& GetTokenizer(const std::string& name) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, std::unique_ptr<Tokenizer>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*cache)[name];
  if (!slot) {
    auto tok = Tokenizer::FromFile(TokenizerPath(name));
    if (!tok.ok()) {
      ADD_FAILURE() << "loading " << name << ": " << tok.status();
      std::abort();
    }
    slot = *std::move(tok);
  }
  return *slot;
}

std::string ReadFileOrDie(const std::string& path) {
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (f == nullptr) {
      ADD_FAILURE() << "cannot open " << path;
      std::abort();
    }
    std::string out;
    char buf[1 << 16];
    int n;
    while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
    gzclose(f);
    if (n < 0) {
      ADD_FAILURE() << "cannot decompress " << path;
      std::abort();
    }
    return out;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot open " << path;
    std::abort();
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    const size_t nl = text.find('\n', start);
    if (nl == std::string::npos) {
      lines.push_back(text.substr(start));
      break;
    }
    lines.push_back(text.substr(start, nl + 1 - start));
    start = nl + 1;
  }
  return lines;
}

std::string Fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (int32_t id : ids) {
    const uint32_t u = static_cast<uint32_t>(id);
    for (int i = 0; i < 4; ++i) {
      h ^= (u >> (8 * i)) & 0xFF;
      h *= 0x100000001B3ULL;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace rl::tokenizer::testing
