#pragma once

// Command-line helpers shared by the binaries.

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace mptrain {

// How a program's command line is described and spelled.
struct CommandLineOptions {
  // Printed by -h/--help (then the flags) and after a usage error.
  std::string usage;
  // One-letter spellings of long flags: {"o", "output"} makes `-o json` `--output json`.
  std::map<std::string, std::string> short_flags;
  // Where a program has verbs (trainctl): the help of the verb the positional arguments
  // (program name first) name, or "" for the program's own. Unset: always the program's.
  std::function<std::string(const std::vector<std::string>& positional)> verb_help;
};

// Parses flags with absl after accepting the dashed spellings the docs use
// (`--heartbeat-timeout 5` is `--heartbeat_timeout=5`; absl only knows underscores) and
// expanding flag files (`--flagfile=F`: one flag a line, `#` comments; nested ones too) in
// place, so that repeatable flags given there count (RepeatedFlagValues). `--fromenv` and
// `--tryfromenv` are refused (a repeatable flag's values could not be seen).
// `-h`/`--help` (and absl's --helpfull/--helpshort) print the usage and every flag of the
// program, not absl's own, to stdout and exit 0; `--version` prints the build's version
// (BuildVersion) and exits 0. A bad command line (an unknown flag, a value that does not
// parse, a flag without its value) exits 2 with one line naming the flag and a pointer to
// --help. Returns the positional arguments, program name first.
std::vector<std::string> ParseFlags(int argc, char** argv, const CommandLineOptions& options);
std::vector<std::string> ParseFlags(int argc, char** argv, const std::string& usage);

// What --version prints: "PROGRAM VERSION (release build)" or "(debug build: assertions on)".
std::string VersionLine(const std::string& program);

// The flags --help lists (those defined outside absl), one `  --name=DEFAULT  help` a line,
// sorted by name.
std::string FlagListing();

// ParseFlags' check of a command line (for tests): "" if every flag is known and its value
// parses, else the one-line problem. `args`: normalized, flag files expanded, program first.
std::string CheckFlags(const std::vector<std::string>& args);

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
