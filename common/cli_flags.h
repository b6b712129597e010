#pragma once

// Command-line helpers shared by the binaries.

#include <string>
#include <vector>

namespace mptrain {

// Parses flags with absl after accepting the dashed spellings the docs use
// (`--heartbeat-timeout 5` is `--heartbeat_timeout=5`; absl only knows underscores) and
// expanding flag files (`--flagfile=F`: one flag a line, `#` comments; nested ones too) in
// place, so that repeatable flags given there count (RepeatedFlagValues). `--fromenv` and
// `--tryfromenv` are refused (a repeatable flag's values could not be seen). `--help` lists
// every flag of the program, not absl's own. Exits 1 with a message on a bad command line.
// Returns the positional arguments, program name first.
std::vector<std::string> ParseFlags(int argc, char** argv, const std::string& usage);

// The arguments ParseFlags parsed: dashes normalized, flag files expanded.
const std::vector<std::string>& ParsedArguments();

// Every value of a flag that may be given more than once (absl keeps only the last):
// `--data_root=/a --data_root /b --data_root=/c,/d` gives {/a, /b, /c, /d}. Stops at `--`.
std::vector<std::string> RepeatedFlagValues(const std::vector<std::string>& args,
                                            const std::string& name);

// ParseFlags' flag-file expansion (for tests): `args` with every --flagfile replaced by the
// flags its files hold, or an error naming the file and the line.
struct ExpandedArguments {
  std::vector<std::string> args;
  std::string error;  // Empty: fine.
};
ExpandedArguments ExpandFlagFiles(const std::vector<std::string>& args);

}  // namespace mptrain
