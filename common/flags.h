// Command-line flags → config structs. Each binary declares its flags in one table bound to the
// fields of its config struct, parses argv once in main.cc, then validates the struct.
//
// Accepted forms: `--name value`, `--name=value`; booleans also `--name` and `--name=false`;
// list flags repeat (`--worker A --worker B`). Flag names use dashes, as in DESIGN.md. Unknown
// flags, missing values and unparsable numbers are InvalidArgument errors naming the flag.
// Arguments that are not flags are returned in order (subcommands); `--` ends flag parsing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rl {

class FlagSet {
 public:
  explicit FlagSet(std::string program) : program_(std::move(program)) {}

  void String(const std::string& name, std::string* target, const std::string& help);
  void Int(const std::string& name, int64_t* target, const std::string& help);
  void Int(const std::string& name, int* target, const std::string& help);
  void Double(const std::string& name, double* target, const std::string& help);
  void Bool(const std::string& name, bool* target, const std::string& help);
  void StringList(const std::string& name, std::vector<std::string>* target,
                  const std::string& help);

  // Parses argv[1..]; returns the positional arguments. `--help` sets help_requested().
  absl::StatusOr<std::vector<std::string>> Parse(int argc, const char* const* argv);
  absl::StatusOr<std::vector<std::string>> Parse(const std::vector<std::string>& args);
  bool help_requested() const { return help_requested_; }
  // Whether the last Parse set flag `name` (tells `--text ""` from no --text).
  bool IsSet(const std::string& name) const;
  // For binaries without positional arguments: parses argv, prints the usage on --help (exit
  // code 0) or "<program>: <error>" on a bad flag or a stray argument (exit code 2). Returns
  // nullopt when the program should go on.
  std::optional<int> ParseMain(int argc, const char* const* argv);
  // "Usage: ..." with every flag, its default and help.
  std::string Usage() const;

 private:
  enum class Kind { kString, kInt64, kInt, kDouble, kBool, kList };
  struct Flag {
    std::string name;
    Kind kind;
    void* target;
    std::string help;
    std::string default_text;
  };
  void Add(const std::string& name, Kind kind, void* target, const std::string& help,
           std::string default_text);
  absl::Status Set(const Flag& flag, const std::string& value) const;

  std::string program_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
  std::vector<std::string> set_names_;
};

}  // namespace rl
