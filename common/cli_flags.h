#pragma once

// Command-line helpers shared by the binaries.

#include <string>
#include <vector>

namespace mptrain {

// Parses flags with absl after accepting the dashed spellings the docs use
// (`--heartbeat-timeout 5` is `--heartbeat_timeout=5`; absl only knows underscores).
// Returns the positional arguments, program name first.
std::vector<std::string> ParseFlags(int argc, char** argv, const std::string& usage);

}  // namespace mptrain
