#include "common/cli_flags.h"

#include <sys/stat.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace mptrain {
namespace {

// Flag files are small; nesting is bounded (a file that names itself must not loop), and so
// is what they expand to (one that names itself twice would double at every level).
constexpr int kMaxFlagFileDepth = 8;
constexpr std::streamsize kMaxFlagFileBytes = 1 << 20;
constexpr size_t kMaxExpandedArguments = 10'000;

std::vector<std::string>& Parsed() {
  static std::vector<std::string> args;
  return args;
}

// `--name=value` / `--name value` as a flag name and its value; the name with '-' as '_',
// and absl's one-dash spelling (`-name=value`) with two.
std::string NormalizedFlag(std::string arg) {
  if (arg.size() > 1 && arg[0] == '-' && arg[1] != '-' &&
      std::isalpha(static_cast<unsigned char>(arg[1]))) {
    arg.insert(0, "-");
  }
  size_t end = arg.find('=');
  if (end == std::string::npos) end = arg.size();
  for (size_t j = 2; j < end; ++j) {
    if (arg[j] == '-') arg[j] = '_';
  }
  return arg;
}

// `in_file`: args are a flag file's lines (each a whole flag: no `--`, no value on the next
// line).
bool ExpandInto(const std::vector<std::string>& args, int depth, bool in_file,
                std::vector<std::string>* out, std::string* error) {
  bool after_terminator = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (out->size() >= kMaxExpandedArguments) {
      *error = absl::StrCat("the flags expand to more than ", kMaxExpandedArguments,
                            " arguments (a --flagfile naming itself?)");
      return false;
    }
    if (arg == "--" && in_file) {
      *error = "a --flagfile may not hold `--` (it would end the flags)";
      return false;
    }
    if (arg == "--") after_terminator = true;
    if (!after_terminator && arg.size() > 1 && arg[0] == '-' && arg != "--") {
      arg = NormalizedFlag(arg);
    }
    std::string files;
    if (!after_terminator && arg == "--flagfile" && in_file) {
      *error = "--flagfile in a flag file needs its file on the same line (--flagfile=FILE)";
      return false;
    }
    if (!after_terminator && arg == "--flagfile" && i + 1 < args.size()) {
      files = args[++i];
    } else if (!after_terminator && absl::StartsWith(arg, "--flagfile=")) {
      files = arg.substr(std::string("--flagfile=").size());
    } else {
      out->push_back(arg);
      continue;
    }
    if (depth >= kMaxFlagFileDepth) {
      *error = absl::StrCat("--flagfile nested more than ", kMaxFlagFileDepth, " deep at ", files);
      return false;
    }
    for (absl::string_view file : absl::StrSplit(files, ',', absl::SkipEmpty())) {
      const std::string path(file);
      struct stat info {};
      if (stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) {
        *error = absl::StrCat("--flagfile ", path, ": not a readable regular file");
        return false;
      }
      if (info.st_size > kMaxFlagFileBytes) {
        // Neither its size nor (below) its lines: the file may be one the user may not read
        // (--flagfile=/etc/shadow of a daemon run as root).
        *error = absl::StrCat("--flagfile ", path, ": more than the ", kMaxFlagFileBytes,
                              " bytes a flag file may hold");
        return false;
      }
      std::ifstream in(path);
      std::vector<std::string> lines;
      std::string line;
      for (int number = 1; std::getline(in, line); ++number) {
        absl::string_view text = absl::StripAsciiWhitespace(line);
        if (text.empty() || text[0] == '#') continue;
        if (!absl::StartsWith(text, "-")) {
          *error = absl::StrCat("--flagfile ", path, " line ", number,
                                ": not a flag (one --name=value a line)");
          return false;
        }
        lines.emplace_back(text);  // One dash or two: NormalizedFlag makes it two.
      }
      if (!ExpandInto(lines, depth + 1, /*in_file=*/true, out, error)) return false;
    }
  }
  return true;
}

}  // namespace

ExpandedArguments ExpandFlagFiles(const std::vector<std::string>& args) {
  ExpandedArguments expanded;
  if (args.empty()) return expanded;
  expanded.args.push_back(args[0]);  // The program name is never a flag.
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (!ExpandInto(rest, 0, /*in_file=*/false, &expanded.args, &expanded.error)) {
    expanded.args.clear();
  }
  return expanded;
}

std::vector<std::string> ParseFlags(int argc, char** argv, const std::string& usage) {
  absl::SetProgramUsageMessage(
      absl::StrCat(usage, "\n(--help lists every flag; --flagfile=F reads flags from F)"));
  // absl's --help lists the flags of a file named after the program only: ours are in main.cc
  // and the libraries, so every flag outside absl's own is listed.
  absl::FlagsUsageConfig config;
  auto ours = [](absl::string_view file) { return !absl::StrContains(file, "absl/"); };
  config.contains_help_flags = ours;
  config.contains_helpshort_flags = ours;
  absl::SetFlagsUsageConfig(config);

  ExpandedArguments expanded = ExpandFlagFiles(std::vector<std::string>(argv, argv + argc));
  if (!expanded.error.empty()) {
    std::cerr << (argc > 0 ? argv[0] : "mptrain") << ": " << expanded.error << "\n";
    std::exit(1);
  }
  for (const std::string& arg : expanded.args) {
    if (arg == "--") break;
    if (absl::StartsWith(arg, "--fromenv") || absl::StartsWith(arg, "--tryfromenv")) {
      std::cerr << argv[0] << ": " << arg
                << " is not supported: pass the flags on the command line or in a --flagfile\n";
      std::exit(1);
    }
  }
  Parsed() = expanded.args;
  std::vector<char*> pointers;
  for (std::string& arg : expanded.args) pointers.push_back(arg.data());
  std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(pointers.size()),
                                                         pointers.data());
  return std::vector<std::string>(positional.begin(), positional.end());
}

const std::vector<std::string>& ParsedArguments() { return Parsed(); }

std::vector<std::string> RepeatedFlagValues(const std::vector<std::string>& args,
                                            const std::string& name) {
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
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") break;
    for (const std::string& flag : flags) {
      if (arg == flag && i + 1 < args.size()) {
        add(args[++i]);
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
