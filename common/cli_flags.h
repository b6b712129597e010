#pragma once

// Command-line helpers shared by the binaries.

#include <string>
#include <vector>

namespace mptrain {

// Parses flags with absl after accepting the dashed spellings the docs use
// (`--heartbeat-timeout 5` is `--heartbeat_timeout=5`; absl only knows underscores).
// Returns the positional arguments, program name first.
std::vector<std::string> ParseFlags(int argc, char** argv, const std::string& usage);

// Every value of a flag that may be given more than once (absl keeps only the last):
// `--data_root=/a --data_root /b --data_root=/c,/d` gives {/a, /b, /c, /d}. Stops at `--`.
std::vector<std::string> RepeatedFlagValues(int argc, char** argv, const std::string& name);

}  // namespace mptrain
