// tokenizer_bench: encode throughput (MB/s of UTF-8 input, tokens/s) of the C++ tokenizer on
// the shared corpus, single-thread and batched, plus decode throughput.
//
//   tokenizer_bench [--tokenizers DIR] [--corpus DIR] [--names qwen2,llama2] [--threads N]
//                   [--repeat N]
// Defaults: DIR = $RL_TEST_DATA/tokenizers (else the configured shared folder), corpus =
// DIR/../../corpus. Workloads per tokenizer and corpus file: "lines" (every line encoded
// separately, one thread), "whole" (the file as one text), "batch" (EncodeBatch over the
// lines on N threads) and "decode" (Decode of each line's ids). Each figure is the best of
// --repeat timed runs after one warm-up run. One line per result, `key=value` fields, parsed
// by compare_hf.py.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/flags.h"
#include "common/tokenizer/tokenizer.h"

namespace {

using rl::tokenizer::Tokenizer;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    nl = nl == std::string::npos ? text.size() : nl + 1;
    lines.push_back(text.substr(start, nl - start));
    start = nl;
  }
  return lines;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Best wall time in seconds of `repeat` runs of `fn` after one warm-up run.
double Time(int repeat, const std::function<size_t()>& fn, size_t* tokens) {
  *tokens = fn();
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    *tokens = fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void Report(const std::string& name, const std::string& workload, const std::string& file,
            int threads, size_t bytes, size_t tokens, double seconds) {
  std::printf(
      "impl=cpp tokenizer=%s workload=%s file=%s threads=%d bytes=%zu tokens=%zu "
      "seconds=%.6f MB/s=%.2f tokens/s=%.0f\n",
      name.c_str(), workload.c_str(), file.c_str(), threads, bytes, tokens, seconds,
      bytes / seconds / 1e6, tokens / seconds);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("RL_TEST_DATA");
  std::string data = env != nullptr ? env : RL_TEST_DATA_DEFAULT;
  std::string tokenizers_dir = data + "/tokenizers";
  std::string corpus_dir;
  std::string names = "qwen2,llama2";
  std::string files = "en_tiny_shakespeare.txt,zh_sanguo_yanyi.txt,mixed_blns.txt";
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int repeat = 3;
  rl::FlagSet flags("tokenizer_bench");
  flags.String("tokenizers", &tokenizers_dir, "folder of tokenizer folders");
  flags.String("corpus", &corpus_dir, "corpus folder (default: TOKENIZERS/../../corpus)");
  flags.String("names", &names, "comma-separated tokenizer names");
  flags.String("files", &files, "comma-separated corpus files");
  flags.Int("threads", &threads, "threads of the batch workload");
  flags.Int("repeat", &repeat, "timed runs per figure (the best is printed)");
  if (std::optional<int> exit = flags.ParseMain(argc, argv)) return *exit;
  if (threads < 1 || repeat < 1) {
    std::fprintf(stderr, "tokenizer_bench: --threads and --repeat must be >= 1\n");
    return 2;
  }
  if (corpus_dir.empty()) corpus_dir = tokenizers_dir + "/../../corpus";

  for (const std::string& name : Split(names, ',')) {
    const auto t0 = std::chrono::steady_clock::now();
    auto tok = Tokenizer::FromDir(tokenizers_dir + "/" + name);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), tok.status().ToString().c_str());
      return 1;
    }
    std::printf("impl=cpp tokenizer=%s workload=load seconds=%.3f\n", name.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (const std::string& file : Split(files, ',')) {
      const std::string text = ReadFile(corpus_dir + "/" + file);
      const std::vector<std::string> lines = SplitLines(text);
      size_t tokens = 0;
      double s = Time(
          repeat,
          [&] {
            size_t n = 0;
            for (const auto& l : lines) n += (*tok)->Encode(l, false)->ids.size();
            return n;
          },
          &tokens);
      Report(name, "lines", file, 1, text.size(), tokens, s);
      s = Time(
          repeat, [&] { return (*tok)->Encode(text, false)->ids.size(); }, &tokens);
      Report(name, "whole", file, 1, text.size(), tokens, s);
      s = Time(
          repeat,
          [&] {
            size_t n = 0;
            const auto batch = (*tok)->EncodeBatch(lines, false, threads);
            for (const auto& e : *batch) n += e.ids.size();
            return n;
          },
          &tokens);
      Report(name, "batch", file, threads, text.size(), tokens, s);
      std::vector<std::vector<int32_t>> ids;
      for (const auto& l : lines) ids.push_back((*tok)->Encode(l, false)->ids);
      s = Time(
          repeat,
          [&] {
            size_t n = 0;
            for (const auto& v : ids) {
              (void)(*tok)->Decode(v, false);
              n += v.size();
            }
            return n;
          },
          &tokens);
      Report(name, "decode", file, 1, text.size(), tokens, s);
    }
  }
  return 0;
}
