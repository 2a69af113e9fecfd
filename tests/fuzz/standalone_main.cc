// A libFuzzer-compatible driver for compilers without libFuzzer (the gcc CI build): runs
// LLVMFuzzerTestOneInput on every seed file, then on random mutations of them (byte flips,
// insertions, deletions, truncations, splices of a seed with itself) for a bounded time and
// count. Deterministic for a given --seed. The real coverage-guided fuzzing is scripts/fuzz.
//
// Usage: NAME_smoke [--seconds=N] [--runs=N] [--seed=N] [--prefix=HEXBYTE] [SEED_FILE...]
// --prefix prepends one byte to every seed file (targets whose first byte picks a mode).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string Mutate(const std::string& in, std::mt19937_64& rng) {
  std::string s = in;
  const int edits = 1 + static_cast<int>(rng() % 8);
  for (int e = 0; e < edits; ++e) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 6) {
      case 0:
        if (!s.empty() && pos < s.size()) s[pos] = static_cast<char>(rng());
        break;
      case 1:
        s.insert(pos, 1, static_cast<char>(rng()));
        break;
      case 2:
        if (pos < s.size()) s.erase(pos, 1 + rng() % 16);
        break;
      case 3:
        s.resize(pos);
        break;
      case 4: {
        static const char* kTokens[] = {"{",    "}",    "[",  "]",     "\"",
                                        ":",    ",",    "-1", "1e999", "18446744073709551615",
                                        "\xff", "\x80", "\0"};
        s.insert(pos, kTokens[rng() % (sizeof(kTokens) / sizeof(kTokens[0]))]);
        break;
      }
      default:
        if (!in.empty()) {
          const size_t from = rng() % in.size();
          s.insert(pos, in.substr(from, 1 + rng() % 64));
        }
        break;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3;
  long long max_runs = 1000000;
  uint64_t seed = 1;
  std::string prefix;
  std::vector<std::string> seeds = {"", "{}", std::string(16, '\0')};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--seconds=", 0) == 0) {
      seconds = std::atof(a.c_str() + 10);
    } else if (a.rfind("--runs=", 0) == 0) {
      max_runs = std::atoll(a.c_str() + 7);
    } else if (a.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(a.c_str() + 7, nullptr, 10);
    } else if (a.rfind("--prefix=", 0) == 0) {
      prefix.assign(1, static_cast<char>(std::strtol(a.c_str() + 9, nullptr, 16)));
    } else {
      std::ifstream in(a, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "cannot read seed %s\n", a.c_str());
        return 2;
      }
      std::stringstream ss;
      ss << in.rdbuf();
      seeds.push_back(prefix + ss.str());
    }
  }
  std::mt19937_64 rng(seed);
  long long runs = 0;
  for (const std::string& s : seeds) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    ++runs;
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
  while (runs < max_runs && std::chrono::steady_clock::now() < deadline) {
    const std::string input = Mutate(seeds[rng() % seeds.size()], rng);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    ++runs;
  }
  std::printf("%lld runs, no crash\n", runs);
  return 0;
}
