#include "common/flags.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rl {

void FlagSet::Add(const std::string& name, Kind kind, void* target, const std::string& help,
                  std::string default_text) {
  flags_.push_back(Flag{name, kind, target, help, std::move(default_text)});
}

void FlagSet::String(const std::string& name, std::string* target, const std::string& help) {
  Add(name, Kind::kString, target, help, *target);
}
void FlagSet::Int(const std::string& name, int64_t* target, const std::string& help) {
  Add(name, Kind::kInt64, target, help, absl::StrCat(*target));
}
void FlagSet::Int(const std::string& name, int* target, const std::string& help) {
  Add(name, Kind::kInt, target, help, absl::StrCat(*target));
}
void FlagSet::Double(const std::string& name, double* target, const std::string& help) {
  Add(name, Kind::kDouble, target, help, absl::StrCat(*target));
}
void FlagSet::Bool(const std::string& name, bool* target, const std::string& help) {
  Add(name, Kind::kBool, target, help, *target ? "true" : "false");
}
void FlagSet::StringList(const std::string& name, std::vector<std::string>* target,
                         const std::string& help) {
  Add(name, Kind::kList, target, help, absl::StrJoin(*target, ","));
}

absl::Status FlagSet::Set(const Flag& flag, const std::string& value) const {
  const auto bad = [&](const char* what) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag.name, ": '", value, "' is not ", what));
  };
  switch (flag.kind) {
    case Kind::kString:
      *static_cast<std::string*>(flag.target) = value;
      return absl::OkStatus();
    case Kind::kList:
      static_cast<std::vector<std::string>*>(flag.target)->push_back(value);
      return absl::OkStatus();
    case Kind::kInt64:
      if (!absl::SimpleAtoi(value, static_cast<int64_t*>(flag.target))) return bad("an integer");
      return absl::OkStatus();
    case Kind::kInt:
      if (!absl::SimpleAtoi(value, static_cast<int*>(flag.target))) return bad("an integer");
      return absl::OkStatus();
    case Kind::kDouble:
      if (!absl::SimpleAtod(value, static_cast<double*>(flag.target))) return bad("a number");
      return absl::OkStatus();
    case Kind::kBool:
      if (!absl::SimpleAtob(value, static_cast<bool*>(flag.target))) return bad("true or false");
      return absl::OkStatus();
  }
  return absl::InternalError("unreachable flag kind");
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return Parse(args);
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  set_names_.clear();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      positional.insert(positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    if (name == "help" || name == "h") {
      help_requested_ = true;
      continue;
    }
    auto it =
        std::find_if(flags_.begin(), flags_.end(), [&](const Flag& f) { return f.name == name; });
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (see ", program_, " --help)"));
    }
    if (!has_value) {
      if (it->kind == Kind::kBool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
      }
    }
    if (absl::Status s = Set(*it, value); !s.ok()) return s;
    set_names_.push_back(name);
  }
  return positional;
}

bool FlagSet::IsSet(const std::string& name) const {
  return std::find(set_names_.begin(), set_names_.end(), name) != set_names_.end();
}

std::optional<int> FlagSet::ParseMain(int argc, const char* const* argv) {
  auto positional = Parse(argc, argv);
  if (help_requested_) {
    std::cout << Usage();
    return 0;
  }
  if (!positional.ok() || !positional->empty()) {
    std::cerr << program_ << ": "
              << (positional.ok() ? "unexpected argument '" + positional->front() + "'"
                                  : std::string(positional.status().message()))
              << "\n";
    return 2;
  }
  return std::nullopt;
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("Usage: ", program_, " [flags]\n");
  for (const Flag& f : flags_) {
    absl::StrAppend(&out, "  --", f.name, "  ", f.help);
    if (!f.default_text.empty()) absl::StrAppend(&out, " (default: ", f.default_text, ")");
    out += "\n";
  }
  return out;
}

}  // namespace rl
