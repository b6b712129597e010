#include "common/cli_flags.h"

#include <sys/stat.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>

#include <algorithm>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/build_version.h"

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

namespace {

bool IsOurs(absl::string_view file) { return !absl::StrContains(file, "absl/"); }

// A flag's name fit to be repeated in an error: a command line may hold what a flag file
// held, and that is never echoed beyond a short name of flag characters.
std::string ShownName(absl::string_view name) {
  const bool plain = !name.empty() && name.size() <= 64 &&
                     std::all_of(name.begin(), name.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                     });
  return plain ? absl::StrCat("--", name) : std::string("a flag (name not shown)");
}

std::string ValueKind(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "true or false";
  if (flag.IsOfType<int32_t>() || flag.IsOfType<int64_t>()) return "an integer";
  if (flag.IsOfType<uint32_t>() || flag.IsOfType<uint64_t>()) return "an integer >= 0";
  if (flag.IsOfType<double>() || flag.IsOfType<float>()) return "a number";
  return "a value of its kind";
}

struct Walked {
  std::vector<std::string> positional;
  std::string problem;  // Empty: fine.
};

// Walks `args` (normalized, program first) as absl will, setting each flag's value so that
// a bad one is found here, with exit code 2, rather than by absl (exit 1, the value echoed).
Walked WalkFlags(const std::vector<std::string>& args, bool set_values) {
  Walked walked;
  if (args.empty()) return walked;
  walked.positional.push_back(args[0]);
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      walked.positional.insert(walked.positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      walked.positional.push_back(arg);
      continue;
    }
    const size_t equals = arg.find('=');
    std::string name = arg.substr(2, equals == std::string::npos ? std::string::npos : equals - 2);
    std::optional<std::string> value;
    if (equals != std::string::npos) value = arg.substr(equals + 1);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no") && !value) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        flag = negated;
        value = "false";
      }
    }
    if (flag == nullptr) {
      walked.problem = absl::StrCat("unknown flag ", ShownName(name));
      return walked;
    }
    if (!value && flag->IsOfType<bool>()) value = "true";
    if (!value) {
      if (i + 1 >= args.size()) {
        walked.problem = absl::StrCat(ShownName(name), " needs a value");
        return walked;
      }
      value = args[++i];
    }
    std::string ignored;
    if (set_values && !flag->ParseFrom(*value, &ignored)) {
      walked.problem = absl::StrCat(ShownName(name), ": the value must be ", ValueKind(*flag));
      return walked;
    }
  }
  return walked;
}

}  // namespace

std::string VersionLine(const std::string& program) {
#ifdef NDEBUG
  constexpr char kKind[] = "release build";
#else
  constexpr char kKind[] = "debug build: assertions on";
#endif
  return absl::StrCat(program, " ", BuildVersion(), " (", kKind, ")");
}

std::string FlagListing() {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsOurs(flag->Filename()) && !flag->IsRetired()) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](auto* a, auto* b) { return a->Name() < b->Name(); });
  std::string out;
  for (const absl::CommandLineFlag* flag : flags) {
    const std::string default_value = flag->DefaultValue();
    absl::StrAppend(&out, "  --", flag->Name(),
                    default_value.empty() ? std::string() : "=" + default_value, "\n      ",
                    flag->Help(), "\n");
  }
  return out;
}

std::string CheckFlags(const std::vector<std::string>& args) {
  return WalkFlags(args, /*set_values=*/true).problem;
}

std::vector<std::string> ParseFlags(int argc, char** argv, const std::string& usage) {
  CommandLineOptions options;
  options.usage = usage;
  return ParseFlags(argc, argv, options);
}

std::vector<std::string> ParseFlags(int argc, char** argv, const CommandLineOptions& options) {
  const std::string program = argc > 0 && argv[0] != nullptr ? argv[0] : "mptrain";
  const std::string name = program.substr(program.rfind('/') + 1);
  absl::SetProgramUsageMessage(
      absl::StrCat(options.usage, "\n(--help lists every flag; --flagfile=F reads flags from F)"));
  // absl's own --help (not reached: handled below) would list the flags of a file named after
  // the program only: ours are in main.cc and the libraries.
  absl::FlagsUsageConfig config;
  config.contains_help_flags = IsOurs;
  config.contains_helpshort_flags = IsOurs;
  config.version_string = [name] { return VersionLine(name) + "\n"; };
  absl::SetFlagsUsageConfig(config);
  auto usage_error = [&](const std::string& problem) {
    std::cerr << name << ": " << problem << " (" << name << " --help tells the usage)\n";
    std::exit(2);
  };

  ExpandedArguments expanded = ExpandFlagFiles(std::vector<std::string>(argv, argv + argc));
  if (!expanded.error.empty()) usage_error(expanded.error);
  bool help = false;
  bool version = false;
  for (std::string& arg : expanded.args) {
    if (arg == "--") break;
    if (arg.size() < 3 || arg[0] != '-' || arg[1] != '-') continue;
    const size_t equals = std::min(arg.find('='), arg.size());
    auto alias = options.short_flags.find(arg.substr(2, equals - 2));
    if (alias != options.short_flags.end()) arg = "--" + alias->second + arg.substr(equals);
    if (arg == "--h" || arg == "--help" || arg == "--helpfull" || arg == "--helpshort" ||
        absl::StartsWith(arg, "--help=")) {
      help = true;
    }
    if (arg == "--version") version = true;
    if (absl::StartsWith(arg, "--fromenv") || absl::StartsWith(arg, "--tryfromenv")) {
      usage_error(absl::StrCat(arg.substr(0, equals),
                               " is not supported: pass the flags on the command line or in a "
                               "--flagfile"));
    }
  }
  if (help) {
    // The positional arguments name the verb; values are not checked (help always works).
    const Walked walked = WalkFlags(expanded.args, /*set_values=*/false);
    const std::string verb = options.verb_help ? options.verb_help(walked.positional) : "";
    if (!verb.empty()) {
      std::cout << verb;
    } else {
      std::cout << "usage: " << options.usage << "\n\nflags:\n" << FlagListing();
    }
    std::cout.flush();
    std::exit(0);
  }
  if (version) {
    std::cout << VersionLine(name) << "\n";
    std::exit(0);
  }
  const std::string problem = CheckFlags(expanded.args);
  if (!problem.empty()) usage_error(problem);
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
