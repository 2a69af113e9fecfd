// make_test_model: command-line front end of the test-model maker, used by
// tests/golden/model/make_hf_fixtures.py to create the checkpoints Hugging Face runs on.
//   make_test_model --arch llama|qwen2|qwen3 --size tiny|0.5b|1b|8b --seed N
//                   [--dtype float32|bfloat16|float16] --out DIR
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/model_io/model_maker.h"

int main(int argc, char** argv) {
  rl::model_io::MakeModelOptions opts;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--arch") {
      opts.arch = value;
    } else if (flag == "--size") {
      opts.size = value;
    } else if (flag == "--seed") {
      opts.seed = std::strtoull(value.c_str(), nullptr, 10);
    } else if (flag == "--dtype") {
      opts.dtype = value;
    } else if (flag == "--out") {
      opts.out_dir = value;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const absl::Status status = rl::model_io::MakeModel(opts);
  if (!status.ok()) {
    std::fprintf(stderr, "make_test_model: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
