// rlctl's dispatch: command name → the family function that runs it (commands.h).
#include "tools/rlctl/commands.h"

#include <iostream>
#include <map>
#include <string>

namespace rl::rlctl {
namespace {

using Command = int (*)(const Options&, const Client&);

const std::map<std::string, Command>& RemoteCommands() {
  static const auto* kCommands = new std::map<std::string, Command>{
      {"generate", &Generate},
      {"retrieve", &Retrieve},
      {"episode", &Episode},
      {"abort", &Abort},
      {"health", &Health},
      {"metrics", &Metrics},
      {"pause", &Pause},
      {"continue", &Continue},
      {"flush", &Flush},
      {"release-memory", &ReleaseMemory},
      {"resume-memory", &ResumeMemory},
      {"update-weights", &UpdateWeights},
      {"stage-weights", &StageWeights},
      {"activate-weights", &ActivateWeights},
      {"drop-staged-weights", &DropStagedWeights},
      {"refit", &RefitWeights},
      {"push", &Push},
      {"weights-checker", &WeightsChecker},
      {"model-info", &ModelInfo},
      {"server-info", &ServerInfo},
      {"list-weights", &ListWeights},
      {"init-group", &InitGroup},
      {"destroy-group", &DestroyGroup},
      {"prepare-weights", &PrepareWeights},
      {"complete-weights", &CompleteWeights},
      {"receive-weights", &ReceiveWeights},
  };
  return *kCommands;
}

}  // namespace

int Run(const Options& o, const std::vector<std::string>& args) {
  const std::string& cmd = args[0];
  if (cmd == "make-model") return MakeModel(o);
  if (cmd == "publish") return Publish(o);
  if (cmd == "publish-delta") return PublishDelta(o);
  if (cmd == "tokenize" || cmd == "detokenize") {
    absl::Status s = cmd == "tokenize" ? Tokenize(o) : Detokenize(o);
    return s.ok() ? 0 : Fail(o, s);
  }
  const Client c(o);
  if (cmd == "workers") return Workers(o, c, args);
  auto it = RemoteCommands().find(cmd);
  if (it == RemoteCommands().end()) {
    return Fail(o, Usage("unknown command '" + cmd + "' (see rlctl --help)"));
  }
  return it->second(o, c);
}

int UsageError(bool json, const std::string& message) {
  if (json) {
    std::cout << Json{{"error", {{"code", "INVALID_ARGUMENT"}, {"message", message}}}}.dump()
              << "\n";
  } else {
    std::cerr << "rlctl: " << message << "\n";
  }
  return 2;
}

}  // namespace rl::rlctl
