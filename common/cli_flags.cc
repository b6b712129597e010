#include "common/cli_flags.h"

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"

namespace mptrain {

std::vector<std::string> ParseFlags(int argc, char** argv, const std::string& usage) {
  absl::SetProgramUsageMessage(usage);
  std::vector<std::string> normalized;
  bool after_terminator = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") after_terminator = true;
    if (!after_terminator && i > 0 && arg.rfind("--", 0) == 0) {
      size_t end = arg.find('=');
      if (end == std::string::npos) end = arg.size();
      for (size_t j = 2; j < end; ++j) {
        if (arg[j] == '-') arg[j] = '_';
      }
    }
    normalized.push_back(arg);
  }
  std::vector<char*> pointers;
  for (std::string& arg : normalized) pointers.push_back(arg.data());
  std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(pointers.size()),
                                                         pointers.data());
  return std::vector<std::string>(positional.begin(), positional.end());
}

std::vector<std::string> RepeatedFlagValues(int argc, char** argv, const std::string& name) {
  std::vector<std::string> values;
  auto add = [&values](const std::string& list) {
    for (absl::string_view value : absl::StrSplit(list, ',', absl::SkipEmpty())) {
      values.emplace_back(value);
    }
  };
  std::string dashed = name;
  for (char& c : dashed) {
    if (c == '_') c = '-';
  }
  const std::vector<std::string> flags =
      dashed == name ? std::vector<std::string>{"--" + name}
                     : std::vector<std::string>{"--" + name, "--" + dashed};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    for (const std::string& flag : flags) {
      if (arg == flag && i + 1 < argc) {
        add(argv[++i]);
        break;
      }
      if (arg.rfind(flag + "=", 0) == 0) {
        add(arg.substr(flag.size() + 1));
        break;
      }
    }
  }
  return values;
}

}  // namespace mptrain
