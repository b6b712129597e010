#include "common/cli_flags.h"

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"

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

}  // namespace mptrain
