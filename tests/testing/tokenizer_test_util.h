// Shared helpers of the tokenizer tests: where the shared data lives, loading a tokenizer
// once per process, reading (gzip) fixtures and the corpus.
#pragma once

#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace rl::tokenizer::testing {

// $RL_TEST_DATA (the shared models folder); the corpus is at DataDir() + "/../corpus".
std::string DataDir();
std::string CorpusDir();
// Path of the tokenizer.json of a named tokenizer: llama2, gpt2, qwen2, llama3, stories260K.
std::string TokenizerPath(const std::string& name);
// Loads a named tokenizer once per process (fails the test on error; never null).
const Tokenizer& GetTokenizer(const std::string& name);
// Whole file content; gzip-compressed files are decompressed. Fails the test on error.
std::string ReadFileOrDie(const std::string& path);
// Splits at '\n', keeping each '\n'; a final piece without '\n' is kept when non-empty.
std::vector<std::string> SplitLines(const std::string& text);
// FNV-1a 64 over the little-endian int32 ids, as hex (matches make_goldens.py).
std::string Fnv1a64(const std::vector<int32_t>& ids);

}  // namespace rl::tokenizer::testing
